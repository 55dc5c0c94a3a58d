"""The model section of every config, declared once (:mod:`posenc.config.schema`).

:class:`Model` declares every field of ``config.model`` with its default,
its check and a line of documentation: model-wide fields, ``model.norm``,
``model.logit_scale`` and ``model.position``, where every registered
encoding with options has its own section ``model.position.<name>`` (e.g.
``model.position.t5.num_buckets``), read off the unit's ``Option``
declarations. ``model_config()`` is its ConfigDict of small CPU-friendly
defaults; :class:`posenc.model.spec.ModelSpec` validates a config against
it (every field's check, unknown fields named with the closest valid one)
and adds the cross-field rules.
"""

from __future__ import annotations

import functools

import ml_collections

from posenc import checks
from posenc.attention import gated
from posenc.config.schema import Field, Section, Sub, options_section
from posenc.model import encoding, options, recurrent_options, registry
from posenc.model.attention_call import IMPLS
from posenc.model.moe_spec import MoE
from posenc.norms import hyper_connections as hc_lib
from posenc.norms import norm_names

RANDOMIZED_PER = ("batch", "example")
LOGIT_SCALES = ("none", "ssmax", "logn", "temperature")
LAYER_RULES = ("all", "positional", "nope")
MLPS = ("gelu", "gelu_erf", "relu2", "swiglu", "geglu")  # posenc.model.layers.MLP
BIASES = ("none", "qkv", "attention", "all")
DTYPES = ("auto", "float32", "bfloat16")
SINKS = ("none", "learned", "zero")  # posenc.learned_sinks: a learned sink per head, or a fixed 0
GATES = ("none", *gated.MODES)  # posenc.gated: the output gate's width per head


def _named(check):
    """A field check from a ``check(value)`` whose ValueError gets the field's name in front."""

    def wrapped(name, value):
        try:
            return check(value)
        except ValueError as e:
            raise ValueError(f"{name}: {e}") from None

    return wrapped


def _kinds(name, value) -> tuple[str, ...]:
    if not isinstance(value, (tuple, list)):
        raise ValueError(f"{name} must be a tuple of position kinds; got {value!r}")
    return tuple(_named(registry.get)(f"{name}[{i}]", k) and k for i, k in enumerate(value))


def _rules(name, value) -> tuple:
    if not isinstance(value, (tuple, list)):
        raise ValueError(f"{name} must be a tuple of rules (mappings, posenc.model.layer_options); got {value!r}")
    # each rule is checked against the layers by ModelSpec (posenc.model.layer_options.resolve)
    return tuple(dict(r) if hasattr(r, "keys") else r for r in value)


def _spans(name, value) -> tuple[str, ...]:
    if not isinstance(value, (tuple, list)):
        raise ValueError(f"{name} must be a tuple of spans ({', '.join(encoding.SPANS)}); got {value!r}")
    return tuple(checks.choice(f"{name}[{i}]", s, encoding.SPANS) for i, s in enumerate(value))


def _layer_types(name, value) -> tuple[str, ...]:
    kinds = ", ".join(recurrent_options.KINDS)
    if not isinstance(value, (tuple, list)):
        raise ValueError(f"{name} must be a tuple of mixers ({kinds}); got {value!r}")
    return tuple(checks.choice(f"{name}[{i}]", t, recurrent_options.KINDS) for i, t in enumerate(value))


def _layer_indices(name, value) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)):
        raise ValueError(f"{name} must be a tuple of layer indices (ints >= 0); got {value!r}")
    out = tuple(checks.nonnegative_int(f"{name}[{i}]", v) for i, v in enumerate(value))
    if list(out) != sorted(set(out)):
        raise ValueError(f"{name} must list each layer once, in increasing order; got {value!r}")
    return out


class Position(Section):
    """model.position: the encoding of every layer, randomized positions, one section per encoding."""

    kind = Field("rope", _named(lambda v: registry.get(v) and v),
                 "any name of posenc.model.ENCODINGS (or a plugin's)")
    layer_kinds = Field((), _kinds, "explicit per-layer kinds (overrides kind in the layers); () = kind "
                                    "everywhere", type=tuple)
    layers = Field((), _rules, "rules changing the kind or options of some layers (posenc.model.layer_options), "
                               'e.g. ({"every": 6, "offset": 5, "rope.base": 1e6},): Gemma 3\'s global layers',
                   type=tuple)
    randomized = Field(False, checks.boolean, "randomized positions (Ruoss et al. 2023) at training "
                                               "and evaluation, as the reference")
    randomized_max_position = Field(2048, checks.positive_int, "randomized positions are drawn from "
                                                                "[0, randomized_max_position)")
    randomized_per = Field("batch", checks.one_of(*RANDOMIZED_PER),
                           "batch (the reference: one draw per batch) | example")

    @classmethod
    def entries(cls):
        found = super().entries()
        for name, unit in sorted(registry.ENCODINGS.items()):
            sub = _options_sub(unit, name)
            if sub is not None:
                found[name] = sub
        return found


@functools.cache
def _options_sub(unit, name: str) -> Sub | None:
    """The ``model.position.<name>`` section of ``unit``'s options (None without any), built once."""
    opts = options.options_of(unit)
    if not opts:
        return None
    return Sub(options_section(f"{unit.__name__}Options", opts, f"model.position.{name}: options of {name}"),
               f"options of the {name} encoding")


class Norm(Section):
    """model.norm: the norm, its residual placement, QK-norm, soft-capping and embedding scale."""

    kind = Field("rms", _named(norm_names.check_norm_kind), "a norm of posenc.norm_names.NORM_KINDS")
    placement = Field("pre", _named(norm_names.check_placement), "a placement of posenc.norm_names.PLACEMENTS")
    eps = Field(1e-6, checks.positive, "norm epsilon")
    mixln_fraction = Field(0.25, lambda n, v: checks.number(n, v, minimum=0.0, maximum=1.0),
                           "placement mixln: the fraction of post-norm layers (the first ones)")
    dyt_alpha = Field(0.5, checks.positive, "kind dyt: the initial alpha")
    derf_alpha = Field(0.5, checks.positive, "kind derf: the initial alpha (the official code's default; "
                                             "its GPT-2 runs set 1.0)")
    v_norm = Field(False, checks.boolean, "RMS-normalise each value head without a gain, eps model.norm.eps "
                                          "(Gemma 4's v_norm)")
    qk_norm = Field("none", _named(norm_names.check_qk_norm), "QK-norm of posenc.norm_names.QK_NORMS")
    qk_norm_after_rope = Field(False, checks.boolean, "normalise the rotated q, k (Llama 4), not the projections")
    qk_norm_layers = Field("all", checks.one_of(*LAYER_RULES),
                           "all | positional (layers with a position term: Llama 4) | nope")
    attn_softcap = Field(0.0, checks.nonnegative, "attention-logit soft-cap (0 = off)")
    final_softcap = Field(0.0, checks.nonnegative, "output-logit soft-cap (0 = off)")
    embed_scale = Field(False, checks.boolean, "multiply token embeddings by sqrt(d_model)")
    embed_norm = Field(False, checks.boolean, "a norm of model.norm.kind right after the embedding (BLOOM)")


class LogitScale(Section):
    """model.logit_scale: length-aware scaling of the queries (posenc.logit_scale)."""

    kind = Field("none", checks.one_of(*LOGIT_SCALES),
                 "none | ssmax (s log n) | logn (Qwen: max(1, log n / log L_train)) | temperature "
                 "(Llama 4); n = the keys the query sees")
    layers = Field("all", checks.one_of(*LAYER_RULES), "all | positional | nope: the layers it applies to")
    train_length = Field(0, checks.nonnegative_int, "logn: L_train (0: the task's training length)")
    floor_scale = Field(8192.0, checks.positive, "temperature: floor scale")
    attn_scale = Field(0.1, lambda n, v: checks.number(n, v), "temperature: attention scale")
    ssmax_init = Field(0.43, lambda n, v: checks.number(n, v),
                       "ssmax: initial s (the value of the paper's Figure 1)")
    ssmax_bias = Field(False, checks.boolean, "ssmax: s log n + b, b learned per head (init 0)")


class MLA(Section):
    """model.mla: multi-head latent attention (DeepSeek-V2 / V3; posenc.mla) in every layer."""

    kv_lora_rank = Field(0, checks.nonnegative_int, "C: the latent's width (0: MLA off, the usual attention)")
    q_lora_rank = Field(0, checks.nonnegative_int, "Cq: the low-rank query's width (0: one query projection)")
    qk_nope_head_dim = Field(0, checks.nonnegative_int, "N: each head's query / key part without position "
                                                        "(0: head_dim)")
    qk_rope_head_dim = Field(0, checks.nonnegative_int, "R: the rotary part, the key's shared by the heads; "
                                                        "the per-layer encoding acts on it (0: head_dim // 2)")
    v_head_dim = Field(0, checks.nonnegative_int, "V: each head's value width (0: head_dim)")
    absorb = Field(True, checks.boolean, "decoding attends over the cached latent with the key and value "
                                         "projections absorbed (posenc.mla); False: expands keys and values")


class Recurrent(Section):
    """model.recurrent: the options of each recurrent mixer kind of model.layer_types."""

    @classmethod
    def entries(cls):
        found = super().entries()
        for kind, declared in recurrent_options.OPTIONS.items():
            section = options_section(f"{declared.__name__}Options", recurrent_options.options(kind),
                                      declared.__doc__.strip().splitlines()[0])
            found[kind] = Sub(section, f"options of the {kind} mixer")
        return found


class Model(Section):
    """model: the decoder (sizes, attention, spans, norms, positions)."""

    vocab_size = Field(32, checks.positive_int, "vocabulary size (set from the task by a training run)")
    d_model = Field(64, checks.positive_int, "model width")
    num_layers = Field(2, checks.positive_int, "decoder layers")
    recurrences = Field(1, checks.positive_int, "passes through the layers, weights shared, the input embeddings "
                        "added to the hidden state before every pass after the first (McLeish et al. 2024's "
                        "looped transformer, input injection 'add'; their headline: 1 layer x 16)")
    num_heads = Field(4, checks.positive_int, "attention heads")
    num_kv_heads = Field(0, checks.nonnegative_int, "0: num_heads; fewer: grouped-query attention")
    head_dim = Field(0, checks.nonnegative_int, "0: d_model // num_heads")
    mlp = Field("gelu", checks.one_of(*MLPS), "gelu (tanh approximation) | gelu_erf (exact, GPT-NeoX) | "
                                               "relu2 (squared ReLU, Nemotron-H) | swiglu | geglu (tanh gate, Gemma)")
    mlp_ratio = Field(4.0, checks.positive, "MLP hidden width / d_model")
    mlp_hidden = Field(0, checks.nonnegative_int, "MLP width (0: int(mlp_ratio * d_model))")
    bias = Field("none", checks.one_of(*BIASES), "biases: none | qkv (Qwen2) | attention (q, k, v, out) | all "
                                                  "(+ MLP: GPT-NeoX)")
    parallel_residual = Field(False, checks.boolean, "x + attn(N1 x) + mlp(N2 x) (GPT-NeoX, GPT-J); placement pre")
    attention_scale = Field(0.0, checks.nonnegative, "multiplier of q . k (0: 1 / sqrt(head_dim); T5: 1; "
                                                      "Gemma: 1 / sqrt(query_pre_attn_scalar); Granite: "
                                                      "attention_multiplier)")
    embedding_multiplier = Field(1.0, checks.positive, "token embeddings times this (MiniCPM scale_emb, Granite "
                                                       "embedding_multiplier; posenc.multipliers)")
    residual_multiplier = Field(1.0, checks.positive, "every residual branch times this (MiniCPM scale_depth / "
                                                      "sqrt(num_layers), Granite residual_multiplier)")
    logits_multiplier = Field(1.0, checks.positive, "the final hidden state times this before the head (MiniCPM "
                                                    "dim_model_base / d_model, Granite 1 / logits_scaling, "
                                                    "Cohere logit_scale)")
    residual_streams = Field(1, checks.positive_int,
                             "n residual streams joined by hyper-connections (model.hyper_connections) around "
                             "every sublayer (posenc.hyper_connections); 1: the single stream; placement pre")
    hyper_connections = Field("dynamic", checks.one_of(*hc_lib.KINDS),
                              "with residual_streams > 1: dynamic (HC, Zhu et al. 2025) | static (HC without "
                              "the input-dependent terms) | mhc (manifold-constrained HC, Sinkhorn-projected "
                              "stream mixing and a learned final collapse: DeepSeek-V4)")
    dropout = Field(0.0, lambda n, v: checks.number(n, v, minimum=0.0, below=1.0), "dropout rate")
    tie_embeddings = Field(True, checks.boolean, "the head is the transposed token embedding")
    dtype = Field("float32", checks.one_of(*DTYPES), "compute dtype: auto (bfloat16 on GPU / TPU) | "
                                                      "float32 | bfloat16 (params stay float32)")
    attention_block = Field(512, checks.positive_int, "query / key block of the memory-efficient attention")
    attention_impl = Field("auto", checks.one_of(*IMPLS), "auto | dense | blocked | pallas")
    attention_causal_block = Field(64, checks.nonnegative_int,
                                   "dense causal attention: query blocks skip keys past their diagonal "
                                   "(0 = off)")
    attention_sinks = Field("none", checks.one_of(*SINKS),
                            "none | learned (a sink logit per head, init 0, in every softmax's "
                            "denominator: gpt-oss) | zero (a fixed 0: softmax + 1)")
    attention_gate = Field("none", checks.one_of(*GATES),
                           "none | elementwise | headwise: attention output * sigmoid(gate) before the "
                           "output projection; the query projection gives each head's gate after its "
                           "query (Qwen3-Next; Qiu et al. 2025)")
    attention_span = Field("full", checks.one_of(*encoding.SPANS),
                           "full | window (keys j with i - W < j <= i) | chunk (the query's chunk of C)")
    attention_window = Field(0, checks.nonnegative_int, "W of the window layers")
    attention_chunk = Field(0, checks.nonnegative_int, "C of the chunk layers")
    global_every = Field(0, checks.nonnegative_int, "k: layers k-1, 2k-1, ... keep a full span")
    layer_spans = Field((), _spans, "explicit per-layer spans (instead of attention_span / global_every)",
                        type=tuple)
    layer_types = Field((), _layer_types, "each layer's token mixer: attention | mamba2 | gated_deltanet | kda | "
                                          "short_conv | parallel_mamba2 (model.recurrent.<kind>); one per layer "
                                          "or a period repeated; (): attention in every layer", type=tuple)
    layers_without_mlp = Field((), _layer_indices, "layers that have no MLP sublayer (their token mixer alone: "
                                                   "Nemotron-H's mixer blocks with no MLP block after them); () "
                                                   "= an MLP in every layer", type=tuple)
    logit_scale = Sub(LogitScale)
    mla = Sub(MLA)
    moe = Sub(MoE)
    recurrent = Sub(Recurrent)
    position = Sub(Position)
    norm = Sub(Norm)


def position_config() -> ml_collections.ConfigDict:
    """Fields of ``config.model.position``."""
    return Position.config()


def norm_config() -> ml_collections.ConfigDict:
    """Fields of ``config.model.norm``."""
    return Norm.config()


def logit_scale_config() -> ml_collections.ConfigDict:
    """Fields of ``config.model.logit_scale``."""
    return LogitScale.config()


def model_config() -> ml_collections.ConfigDict:
    """Fields of ``config.model`` with small CPU-friendly defaults."""
    return Model.config()
