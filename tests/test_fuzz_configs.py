"""Config fuzzing: random valid experiment configs build, train a step and decode like the full forward;
random invalid ones raise a ValueError naming the field and the allowed values, before any compile and
before the workdir exists.

Valid configs mix every registered encoding (RoPE with each frequency scaling), norm, placement,
QK-norm, soft-caps, grouped-query attention, attention sinks, output gate, compute dtype and attention
implementation, hyper-connections of each kind. Default: a
few examples (one compile each); ``POSENC_SLOW=1``: many more.
"""

import collections
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st
from jax import monitoring

import helpers
from posenc import hyper_connections, norm_names, placements, rope, rope_scaling
from posenc.config import overrides
from posenc.model import ENCODINGS
from posenc.model import config as model_config_lib
from posenc.model.registry import read_options
from posenc.tasks import TASKS
from posenc.training import loop, prepare
from posenc.training import step as step_lib

SLOW = bool(os.environ.get("POSENC_SLOW"))
VALID_EXAMPLES = 60 if SLOW else 4
INVALID_EXAMPLES = 400 if SLOW else 60
TRAIN_LENGTH, LENGTH, PREFILL = 8, 5, 3  # decoding: a prefill of 3, then 2 single steps

_COMPILES = collections.Counter()
monitoring.register_event_duration_secs_listener(
    lambda event, _secs, **_: _COMPILES.update([event]) if event.startswith(
        ("/jax/core/compile", "/jax/compilation_cache")) else None)


def _base():
    from posenc.configs import default

    c = default.get_config("tiny")
    c.task.train_length = TRAIN_LENGTH
    c.train.batch_size = 2
    return c


BASE = _base()


# ---------------------------------------------------------------- valid configs

def _rope_options(draw, head_dim):
    scaling = draw(st.sampled_from(rope_scaling.KINDS))
    used = rope_scaling.KEYWORDS[scaling]
    fraction = 1.0 if scaling == "proportional" else draw(st.sampled_from([1.0, 0.5]))
    opts = {"scaling": scaling, "rotary_fraction": fraction,
            "layout": draw(st.sampled_from(rope.LAYOUTS)), "angles": draw(st.sampled_from(rope.ANGLES))}
    if "factor" in used:
        opts["factor"] = draw(st.sampled_from([2.0, 4.0]))
    if "short_factor" in used:  # LongRoPE: one factor per rotated pair
        pairs = rope.rotary_dim(head_dim, fraction) // 2
        opts["short_factor"] = tuple(1.0 + 0.1 * i for i in range(pairs))
        opts["long_factor"] = tuple(2.0 + 0.5 * i for i in range(pairs))
    if "fraction" in used:
        opts["fraction"] = draw(st.sampled_from([0.5, 1.0]))
    return opts


@st.composite
def valid_fields(draw):
    """Dotted fields of a valid model (tiny sizes) and the explicit positions of the decode check."""
    kind = draw(st.sampled_from(sorted(ENCODINGS)))  # the test plugin too
    num_heads, head_dim = 4, 4  # fixed sizes: the eager initialisers compile once for every example
    f = {"model.position.kind": kind, "model.num_heads": num_heads, "model.head_dim": head_dim,
         "model.d_model": 16, "model.num_layers": draw(st.integers(1, 2)),
         "model.num_kv_heads": draw(st.sampled_from([0, 1, 2])),
         "model.mlp": draw(st.sampled_from(model_config_lib.MLPS)),
         "model.dtype": draw(st.sampled_from(["float32", "bfloat16"])),
         "model.tie_embeddings": draw(st.booleans()),
         "model.attention_impl": draw(st.sampled_from(["auto", "dense", "blocked"])),
         "model.attention_block": draw(st.sampled_from([4, 512])),
         "model.norm.kind": draw(st.sampled_from(sorted(norm_names.NORM_KINDS))),
         "model.norm.placement": draw(st.sampled_from(sorted(norm_names.PLACEMENTS))),
         "model.norm.qk_norm": draw(st.sampled_from(sorted(norm_names.QK_NORMS))),
         "model.norm.attn_softcap": draw(st.sampled_from([0.0, 5.0])),
         "model.norm.final_softcap": draw(st.sampled_from([0.0, 3.0])),
         "model.norm.embed_scale": draw(st.booleans()),
         "model.norm.v_norm": draw(st.booleans()),
         "model.residual_multiplier": draw(st.sampled_from([1.0, 0.5])),
         "model.logits_multiplier": draw(st.sampled_from([1.0, 0.25])),
         "train.z_loss": draw(st.sampled_from([0.0, 1e-4])),
         "model.attention_gate": draw(st.sampled_from(model_config_lib.GATES)),
         # sinks join a softmax: a unit with its own weights takes none
         "model.attention_sinks": "none" if ENCODINGS[kind].own_attention() else draw(
             st.sampled_from(model_config_lib.SINKS))}
    if placements.PLACEMENTS[f["model.norm.placement"]].qkv_norm:  # q, k, v normed already
        f.update({"model.norm.qk_norm": "none", "model.norm.v_norm": False})
    if f["model.norm.placement"] == "pre":  # hyper-connections wrap pre-norm sublayers
        f["model.residual_streams"] = draw(st.sampled_from([1, 2]))
        if f["model.residual_streams"] > 1:
            f["model.hyper_connections"] = draw(st.sampled_from(hyper_connections.KINDS))
    unit, opts = ENCODINGS[kind], read_options(kind, None)
    if placements.PLACEMENTS[f["model.norm.placement"]].sphere:  # nGPT: its own scales, nothing else
        widened = unit.qk_head_dim(opts, head_dim=head_dim) != head_dim
        if unit.own_qk_norm(opts) or unit.rotates_in_attention(opts) or widened or unit.counter_scales_qk(opts):
            f["model.norm.placement"] = "pre"  # a unit whose q, k nGPT cannot scale (or normalise: xPos)
        else:
            f.update({"model.mlp": "swiglu", "model.num_kv_heads": 0, "model.norm.qk_norm": "none",
                      "model.norm.v_norm": False, "model.norm.embed_scale": False,
                      "model.residual_multiplier": 1.0, "model.logits_multiplier": 1.0})
    if kind == "rope":
        f.update({f"model.position.rope.{k}": v for k, v in _rope_options(draw, head_dim).items()})
    if kind == "irope":
        f["model.position.irope.nope_every"] = 2
    if ENCODINGS[kind].hides_keys(read_options(kind, None)):  # a soft-cap would let them through
        f["model.norm.attn_softcap"] = 0.0
    offset = draw(st.sampled_from([0, 2]))  # positions offset ... offset + LENGTH - 1 (< every table)
    return f, offset


def _perturbed(model, seed):
    # Zero-initialised parameters (ReZero gates, CoPE embeddings) must take part in the check.
    helpers.perturb_params(model, jax.random.key(seed), 0.02)


def _check_program(spec):
    """One jit: the real train step, then the full forward and cached decoding of the new model."""
    train_step = step_lib._train_step(spec)

    @jax.jit
    def check(graphdef, state, key, tokens, positions):
        state, metrics = train_step(graphdef, state, key)
        model, _ = nnx.merge(graphdef, state)
        full = model(tokens, positions)
        cached, _ = helpers.decode_stepwise(model, tokens, PREFILL, LENGTH, positions)
        finite = jnp.all(jnp.asarray([jnp.isfinite(x).all() for x in jax.tree.leaves(
            nnx.state(model, nnx.Param))]))
        return metrics, full, cached, finite

    return check


@settings(max_examples=VALID_EXAMPLES)
@given(valid_fields())
def test_random_valid_configs_train_a_step_and_decode_like_the_full_forward(drawn):
    _train_a_step_and_decode(*drawn)


# The 2025-26 norm methods (posenc issue 37) with the encodings: each new kind, placement and field is in
# one of two models, one with dense attention and one blocked (hybrid_star's second layer is hybrid's).
# Default: encodings of each way into attention (rotation, bias, value term, own attention, input embedding)
# in turn with the methods; POSENC_SLOW=1: every encoding with both (42 compiles, minutes).
NORM_METHODS = {
    "derf,hybrid_star,multipliers": {"model.norm.kind": "derf", "model.norm.placement": "hybrid_star",
                                     "model.embedding_multiplier": 2.0, "model.residual_multiplier": 0.7,
                                     "model.logits_multiplier": 0.5, "model.attention_impl": "dense"},
    "lns,v_norm": {"model.norm.placement": "lns", "model.norm.v_norm": True, "model.attention_impl": "blocked",
                   "model.attention_block": 4},
}


_DEFAULT_KINDS = ("alibi", "path_fox", "rope", "shaw", "sinusoidal", "stickbreaking")
NORM_METHOD_CASES = ([(k, m) for k in sorted(ENCODINGS) for m in sorted(NORM_METHODS)] if SLOW else
                     [(k, sorted(NORM_METHODS)[i % len(NORM_METHODS)]) for i, k in enumerate(_DEFAULT_KINDS)])


@pytest.mark.parametrize("kind, method", NORM_METHOD_CASES)
def test_norm_methods_with_the_encodings_train_a_step_and_decode_like_the_full_forward(kind, method):
    fields = {"model.position.kind": kind, "model.num_heads": 4, "model.head_dim": 4, "model.d_model": 16,
              "model.num_layers": 2, **NORM_METHODS[method]}
    if kind == "irope":
        fields["model.position.irope.nope_every"] = 2
    _train_a_step_and_decode(fields, offset=2)


def _train_a_step_and_decode(fields, offset):
    config = prepare.plain_copy(BASE)
    overrides.apply(config, fields)
    resolved = prepare.resolve(config)  # a valid config is accepted as it is
    model, optimizer, _, _ = loop.init_state(resolved)
    _perturbed(model, seed=offset + len(fields))
    graphdef, state = nnx.split((model, optimizer))
    tokens = jax.random.randint(jax.random.key(1), (2, LENGTH), 0, resolved.spec.vocab_size)
    positions = offset + jnp.arange(LENGTH)
    check = _check_program(resolved.train)
    metrics, full, cached, finite = check(graphdef, state, jax.random.key(0), tokens, positions)
    for name in ("loss", "total_loss", "grad_norm"):
        assert math.isfinite(float(metrics[name])), (name, fields)
    assert bool(finite), fields
    assert full.shape == cached.shape == (2, LENGTH, resolved.spec.vocab_size)
    full, cached = np.asarray(full, np.float32), np.asarray(cached, np.float32)
    if fields.get("model.dtype") == "bfloat16":  # the two paths round differently in bfloat16
        scale = max(1.0, float(np.abs(full).max()))
        np.testing.assert_allclose(cached, full, rtol=0, atol=0.02 * scale, err_msg=str(fields))
    else:
        np.testing.assert_allclose(cached, full, rtol=2e-5, atol=5e-5, err_msg=str(fields))


# ---------------------------------------------------------------- invalid configs

def _not_in(allowed):
    return st.one_of(st.text(max_size=8), st.integers(-3, 3), st.none()).filter(lambda v: v not in allowed)


_BAD_INT = {0: st.one_of(st.integers(max_value=-1), st.floats(0.5, 9.5).filter(lambda v: v != int(v)),
                         st.booleans(), st.text(max_size=3), st.none()),
            1: st.one_of(st.integers(max_value=0), st.floats(0.5, 9.5).filter(lambda v: v != int(v)),
                         st.booleans(), st.text(max_size=3), st.none())}
_NOT_FINITE = st.sampled_from([math.nan, math.inf, -math.inf])
_NOT_A_NUMBER = st.one_of(st.text(max_size=3), st.none(), st.booleans())


def _bad_number(minimum=None, below=None, maximum=None, positive=False):
    bad = [_NOT_FINITE, _NOT_A_NUMBER]
    if positive:
        bad.append(st.floats(max_value=0.0, allow_nan=False))
    if minimum is not None:
        bad.append(st.floats(max_value=minimum, exclude_max=True, allow_nan=False, allow_infinity=False))
    if below is not None:
        bad.append(st.floats(min_value=below, allow_nan=False, allow_infinity=False))
    if maximum is not None:
        bad.append(st.floats(min_value=maximum, exclude_min=True, allow_nan=False, allow_infinity=False))
    return st.one_of(*bad)


_BAD_BOOL = st.one_of(st.integers(0, 1), st.text(max_size=3), st.none())
_CHOOSE = "choose one of: "
_INT = "must be an integer"
_NUMBER = "must be "

# field -> (bad values, what the message must say besides the field's name)
MUTATIONS = {
    "model.mlp": (_not_in(model_config_lib.MLPS), _CHOOSE + ", ".join(sorted(model_config_lib.MLPS))),
    "model.dtype": (_not_in(model_config_lib.DTYPES), _CHOOSE + ", ".join(sorted(model_config_lib.DTYPES))),
    "model.attention_sinks": (_not_in(model_config_lib.SINKS), _CHOOSE + ", ".join(sorted(model_config_lib.SINKS))),
    "model.attention_gate": (_not_in(model_config_lib.GATES), _CHOOSE + ", ".join(sorted(model_config_lib.GATES))),
    "model.position.randomized_per": (_not_in(("batch", "example")), _CHOOSE + "batch, example"),
    "model.position.rope.scaling": (_not_in(rope_scaling.KINDS), _CHOOSE + ", ".join(sorted(rope_scaling.KINDS))),
    "model.position.rope.layout": (_not_in(rope.LAYOUTS), _CHOOSE + ", ".join(sorted(rope.LAYOUTS))),
    "task.name": (_not_in(tuple(TASKS)), _CHOOSE + ", ".join(TASKS)),
    **{f"model.{f}": (_BAD_INT[1], _INT + " >= 1") for f in ("d_model", "num_layers", "num_heads",
                                                           "attention_block")},
    **{f"model.{f}": (_BAD_INT[0], _INT + " >= 0") for f in ("num_kv_heads", "head_dim",
                                                           "attention_causal_block")},
    **{f"train.{f}": (_BAD_INT[1], _INT + " >= 1") for f in ("steps", "batch_size", "log_every",
                                                           "checkpoint_every", "keep_checkpoints",
                                                           "fit_check_every")},
    "train.seed": (_BAD_INT[0], _INT + " >= 0"),
    **{f"eval.{f}": (_BAD_INT[1], _INT + " >= 1") for f in ("batch_size", "num_batches", "position_buckets")},
    "eval.seed": (_BAD_INT[0], _INT + " >= 0"),
    "eval.max_tokens_per_step": (_BAD_INT[0], _INT + " >= 0"),
    "task.train_length": (_BAD_INT[1], _INT + " >= 1"),
    "task.min_size": (_BAD_INT[0], _INT + " >= 0"),
    "model.position.randomized_max_position": (_BAD_INT[1], _INT + " >= 1"),
    "model.dropout": (_bad_number(minimum=0.0, below=1.0), _NUMBER),
    "model.mlp_ratio": (_bad_number(positive=True), _NUMBER),
    "model.norm.eps": (_bad_number(positive=True), _NUMBER),
    "model.norm.attn_softcap": (_bad_number(minimum=0.0), _NUMBER),
    "model.norm.final_softcap": (_bad_number(minimum=0.0), _NUMBER),
    "model.position.rope.base": (_bad_number(positive=True), _NUMBER),
    "train.learning_rate": (_bad_number(positive=True), "must be > 0"),
    "train.warmup_steps": (st.one_of(_BAD_INT[0], st.integers(21, 99)), "train.warmup_steps must be "),
    **{f"train.{f}": (_bad_number(minimum=0.0), _NUMBER) for f in ("weight_decay", "clip_norm", "z_loss")},
    **{f"train.{f}": (_bad_number(minimum=0.0, below=1.0), _NUMBER) for f in ("b1", "b2")},
    "train.eps": (_bad_number(positive=True), _NUMBER),
    "train.min_lr_ratio": (_bad_number(minimum=0.0, maximum=1.0), _NUMBER),
    "train.fit_accuracy": (_bad_number(minimum=0.0, maximum=1.0), _NUMBER),
    **{f: (_BAD_BOOL, "must be True or False") for f in (
        "model.tie_embeddings", "model.norm.embed_scale", "model.position.randomized", "train.tensorboard",
        "train.progress", "mesh.fsdp", "model.position.rope.truncate")},
    "eval.lengths": (st.one_of(st.just(()), st.tuples(st.integers(max_value=0)), st.just("16"), st.none(),
                               st.tuples(st.just(16), st.floats(1.5, 9.5))),
                     "must be a non-empty tuple of positive integers"),
    "mesh.data": (st.one_of(st.integers(max_value=-2), st.just(0), st.floats(0.5, 2.5), st.text(max_size=2)),
                  "must be -1 (all devices) or a positive integer"),
    # A field the model does not use (RoPE's default scaling, an encoding no layer has).
    "model.position.rope.factor": (st.floats(1.5, 8.0), "is set, but rope does not use it"),
    "model.position.t5.num_buckets": (st.integers(2, 31), "is set, but no layer uses t5"),
    "model.position.shaw.max_distance": (st.integers(1, 19), "is set, but no layer uses shaw"),
}
# Known gaps: these messages name the choice but not the field (posenc/model/spec.py, norm_names.py).
UNNAMED = {
    "model.position.kind": (_not_in(tuple(ENCODINGS)), _CHOOSE + ", ".join(sorted(ENCODINGS))),
    "model.norm.kind": (_not_in(tuple(norm_names.NORM_KINDS)), _CHOOSE + ", ".join(sorted(norm_names.NORM_KINDS))),
    "model.norm.placement": (_not_in(tuple(norm_names.PLACEMENTS)), _CHOOSE + ", ".join(sorted(norm_names.PLACEMENTS))),
    "model.norm.qk_norm": (_not_in(tuple(norm_names.QK_NORMS)), _CHOOSE + ", ".join(sorted(norm_names.QK_NORMS))),
}


def _set(d: dict, dotted: str, value) -> None:
    *parents, last = dotted.split(".")
    for p in parents:
        d = d[p]
    d[last] = value


def _refused_early(tmp_path, field, value):
    """``loop.run`` of BASE with ``field`` = ``value``: the error, after checking no compile / workdir."""
    d = BASE.to_dict()
    _set(d, field, value)
    workdir = tmp_path / "never"
    before = sum(_COMPILES.values())
    with pytest.raises(ValueError) as e:
        loop.run(d, str(workdir))
    assert isinstance(e.value, prepare.ConfigError)
    assert sum(_COMPILES.values()) == before, f"{field}={value!r} compiled before it was refused"
    assert not workdir.exists(), f"{field}={value!r} claimed its workdir before it was refused"
    return str(e.value)


@settings(max_examples=INVALID_EXAMPLES)
@given(st.sampled_from(sorted(MUTATIONS)).flatmap(lambda f: st.tuples(st.just(f), MUTATIONS[f][0])))
def test_random_invalid_configs_name_the_field_and_the_allowed_values(tmp_path_factory, mutation):
    field, value = mutation
    message = _refused_early(tmp_path_factory.mktemp("bad"), field, value)
    assert field in message and MUTATIONS[field][1] in message, (field, value, message)


@settings(max_examples=20)
@given(st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=10))
def test_an_unknown_model_field_is_an_error_not_ignored(tmp_path_factory, name):
    field = f"model.{name}"
    if name in BASE.model:
        return
    message = _refused_early(tmp_path_factory.mktemp("bad"), field, 1)
    assert (message.startswith(f"unknown config field '{field}'")
            and "the fields of model are: attention_block" in message)


@pytest.mark.parametrize("field", sorted(UNNAMED))
def test_choice_errors_name_their_field(tmp_path, field):
    message = _refused_early(tmp_path, field, "nonsense")
    assert UNNAMED[field][1] in message  # the allowed values are listed ...
    assert field in message  # ... and the field
