"""The first grids: quick (copy, six encodings), smoke (the engine's tests), full (every encoding),
norms (every placement) and scaling (zero-shot RoPE context extension)."""

from __future__ import annotations

from posenc.configs import default
from posenc.configs.compare_grids import common


def more_zero_shot(base, factor: float) -> dict:
    """Dynamic YaRN (s = n / L), YaRN with the quadratic temperature, and LongRoPE with the
    YaRN factors its search starts from (searched factors: the extend study)."""
    from posenc.encodings.rope import rope, rope_search
    from posenc.model import spec as spec_lib

    m = base.model
    rotary = rope.rotary_dim(spec_lib.unit_head_dim(m), m.position.rope.rotary_fraction)  # MLA: its rotary part
    start = rope_search.seed_factors(rotary, factor=factor, original_length=base.task.train_length)["yarn"]
    return {
        "dynamic_yarn": {"model.position.rope.scaling": "dynamic_yarn"},
        "yarn_quadratic": {"model.position.rope.scaling": "yarn", "model.position.rope.factor": factor,
                           "model.position.rope.temperature": "quadratic"},
        "longrope_yarn_start": {"model.position.rope.scaling": "longrope",
                                "model.position.rope.factor": factor,
                                "model.position.rope.short_factor": (1.0,) * len(start),
                                "model.position.rope.long_factor": tuple(float(v) for v in start)},
    }


def _preset_fields(base, name: str) -> dict:
    """The dotted model.* fields that the default config's preset ``name`` sets in ``base``."""
    return {k: v for k, v in default.PRESETS[name](base).items() if k.startswith("model.")}


def attention_variants(base) -> dict:
    """Grid entries beside the encodings: the layer-span presets (Gemma 3, SWAN-GPT, Llama 4),
    sliding-window RoPE, p-RoPE (the lowest quarter of frequencies dropped) and RoPE with
    length-aware logit scaling (SSMax, log-n)."""
    window = max(int(base.task.train_length) // 2, 1)
    return {
        **{name: _preset_fields(base, name) for name in default.PRESETS},
        "rope_window": {"model.position.kind": "rope", "model.attention_span": "window",
                        "model.attention_window": window},
        "p_rope": {"model.position.kind": "rope", "model.position.rope.scaling": "proportional",
                   "model.position.rope.fraction": 0.75},
        "rope_ssmax": {"model.position.kind": "rope", "model.logit_scale.kind": "ssmax"},
        "rope_logn": {"model.position.kind": "rope", "model.logit_scale.kind": "logn"},
    }


def quick(c, arg: str) -> None:
    """Copy up to 7 symbols, six encodings, 3 seeds fitted to 0.99, decoded to 8x."""
    common.quick_copy(c.base)
    # a table of 8x rows (untrained past 16), so that 2x-8x show how it degrades instead of n/a
    c.variants = default.fields({"learned": {"model.position.kind": "learned",
                                             "model.position.learned.max_length": 128}})
    c.grid = common.grid(positions=("nope", "sinusoidal", "learned", "rope", "alibi", "t5"), seeds=(0, 1, 2),
                   vmap_seeds=True)


def smoke(c, arg: str) -> None:
    """Two tiny runs of two seeds each: the engine's tests (seconds per run on 2 cores)."""
    c.base = default.get_config("tiny")
    c.base.task.train_length = 8
    c.base.train.update(steps=8, log_every=4, checkpoint_every=4)
    c.base.eval.update(lengths=(8, 16), batch_size=8)
    c.grid = common.grid(positions=("rope", "alibi"), seeds=(0, 1), vmap_seeds=True)


def full(c, arg: str) -> None:
    """Every registered encoding and the attention variants, copy and reverse, 3 seeds."""
    from posenc.model import ENCODINGS

    c.base.train.progress = False
    c.variants = default.fields(attention_variants(c.base))
    c.grid = common.grid(tasks=("copy", "reverse"), positions=(*sorted(ENCODINGS), *c.variants), seeds=(0, 1, 2))


def norms(c, arg: str) -> None:
    """RoPE with every norm placement, 2 seeds."""
    from posenc.norms import norm_names

    c.base.train.update(learning_rate=3e-3, progress=False)
    from posenc.model.spec import placement_fields

    c.grid = common.grid(placements=tuple(norm_names.PLACEMENTS), seeds=(0, 1))
    # a placement that needs more than its name (nGPT's SwiGLU MLP) is a variant of those fields
    c.variants = default.fields({p: placement_fields(p) for p in norm_names.PLACEMENTS
                                 if len(placement_fields(p)) > 1})


def scaling(c, arg: str) -> None:
    """RoPE context extension at factor 4, zero-shot, beside YaRN-trained RoPE and ALiBi."""
    c.base.train.progress = False
    # Zero-shot context extension: one trained RoPE model per seed, evaluated with each
    # frequency scaling at factor 4 (4x the training length).
    zero_shot = {name: {"model.position.rope.scaling": kind, "model.position.rope.factor": 4.0}
                 for name, kind in (("pi", "linear"), ("ntk", "ntk"), ("dynamic_ntk", "dynamic"),
                                    ("yarn", "yarn"), ("llama3", "llama3"))}
    zero_shot.update(more_zero_shot(c.base, 4.0))
    c.variants = default.fields({
        "rope": {"model.position.kind": "rope", "eval.variants": zero_shot},
        "rope_yarn_trained": {"model.position.kind": "rope", "model.position.rope.scaling": "yarn",
                              "model.position.rope.factor": 4.0},
    })
    c.grid = common.grid(positions=("rope", "rope_yarn_trained", "alibi"), seeds=(0, 1))


GRIDS = {"quick": quick, "smoke": smoke, "full": full, "norms": norms, "scaling": scaling}
