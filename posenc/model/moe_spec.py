"""``model.moe``: the mixture-of-experts MLP, declared once and resolved into a :class:`MoESpec`.

``model.moe.num_experts`` E > 0 turns the MLP of the chosen layers into E
routed experts, ``num_experts_per_tok`` k of them per token (dropless: every
token reaches its k experts), plus optional shared experts
(``posenc.model.moe.MoEMLP``). The fields are named as transformers' configs
name them where one name is shared (``num_experts_per_tok``,
``norm_topk_prob``, ``n_group``, ``first_k_dense_replace``, ...), so a
checkpoint's config maps onto them field by field. Which layers are MoE::

    layer i is MoE  <=>  i >= first_k_dense_replace  and  (i + 1) % decoder_sparse_step == 0
                         and  i not in mlp_only_layers

(DeepSeek-V3 / GLM-4.5 / Kimi K2: ``first_k_dense_replace``; Qwen2/3-MoE:
``decoder_sparse_step``, ``mlp_only_layers``; Llama 4's
``interleave_moe_layer_step`` is ``decoder_sparse_step``); the other layers
keep the dense MLP of ``model.mlp`` and its width ``model.mlp_hidden``
(transformers' ``intermediate_size``), the experts have their own width
``moe_intermediate_size``.

Every field set where it does nothing is refused in one line (a router's
option with another router, a shared expert's with none, any field with the
MoE off), as are the placements the experts cannot take (nGPT's sphere).
"""

from __future__ import annotations

import dataclasses

from posenc import checks
from posenc.config.schema import Field, Section
from posenc.moe import experts as experts_lib
from posenc.moe import routing as routing_lib

ROUTERS = tuple(routing_lib.ROUTERS)  # softmax_top_k | top_k_softmax | sigmoid_top_k | top_k_sigmoid
IMPLS = ("blocked", "ragged", "dense")
GLUS = tuple(experts_lib.GLUS)  # swiglu | clamped_swiglu
SCALES = ("output", "input")
ROUTER_DTYPES = ("compute", "float32")

# The fields only some routers read (the others refuse them when set).
ROUTER_FIELDS = {
    "norm_topk_prob": ("softmax_top_k", "sigmoid_top_k"),
    "round_weights": ("softmax_top_k",),
    "n_group": ("sigmoid_top_k",),
    "topk_group": ("sigmoid_top_k",),
    "routed_scaling_factor": ("sigmoid_top_k",),
    "score_correction_bias": ("sigmoid_top_k",),
}


def _layer_indices(name, value) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)):
        raise ValueError(f"{name} must be a tuple of layer indices; got {value!r}")
    return tuple(checks.integer(f"{name}[{i}]", v, minimum=0) for i, v in enumerate(value))


class MoE(Section):
    """model.moe: mixture-of-experts MLPs (posenc.routing, posenc.experts); num_experts 0: every MLP dense."""

    num_experts = Field(0, checks.nonnegative_int, "E routed experts per MoE layer (num_experts / "
                        "num_local_experts / n_routed_experts); 0: MoE off")
    num_experts_per_tok = Field(2, checks.positive_int, "k experts per token")
    moe_intermediate_size = Field(0, checks.nonnegative_int, "each expert's width I (0: model.mlp_hidden)")
    router = Field("softmax_top_k", checks.one_of(*ROUTERS),
                   "softmax_top_k (Mixtral, Qwen3-MoE, OLMoE) | top_k_softmax (gpt-oss) | sigmoid_top_k "
                   "(DeepSeek-V3, GLM-4.5, Kimi K2) | top_k_sigmoid (Llama 4): posenc.routing")
    norm_topk_prob = Field(False, checks.boolean, "the k weights divided by their sum (Mixtral: always; "
                           "softmax_top_k, sigmoid_top_k)")
    round_weights = Field(False, checks.boolean, "softmax_top_k: weights rounded to the logits' dtype "
                          "(Qwen3-MoE, OLMoE; posenc.routing)")
    n_group = Field(1, checks.positive_int, "sigmoid_top_k: expert groups (DeepSeek-V3: 8)")
    topk_group = Field(1, checks.positive_int, "sigmoid_top_k: groups kept per token (DeepSeek-V3: 4)")
    routed_scaling_factor = Field(1.0, checks.positive, "sigmoid_top_k: weights times this (DeepSeek-V3: 2.5)")
    score_correction_bias = Field(False, checks.boolean,
                                  "sigmoid_top_k: e_score_correction_bias [E], added to the scores for the "
                                  "choice only, not trained (moved by bias_update_rate)")
    router_bias = Field(False, checks.boolean, "a bias of the router logits (gpt-oss)")
    router_dtype = Field("compute", checks.one_of(*ROUTER_DTYPES),
                         "router logits in the compute dtype | float32 (DeepSeek-V3, GLM-4.5)")
    expert_bias = Field(False, checks.boolean, "biases of the experts' projections (gpt-oss)")
    glu = Field("swiglu", checks.one_of(*GLUS), "the experts' gate: swiglu (halves) | clamped_swiglu "
                "(gpt-oss: interleaved, clamped)")
    swiglu_alpha = Field(1.702, checks.positive, "clamped_swiglu: alpha of gate * sigmoid(alpha gate)")
    swiglu_limit = Field(7.0, checks.positive, "clamped_swiglu: the clamp (gpt-oss swiglu_limit)")
    scale = Field("output", checks.one_of(*SCALES), "where the router weight multiplies: output "
                  "(sum_j w expert(x)) | input (sum_j expert(w x): Llama 4)")
    n_shared_experts = Field(0, checks.nonnegative_int, "shared experts on every token (DeepSeek-V3: 1; "
                             "Llama 4 and Qwen3-Next: 1), one MLP of their summed width")
    shared_expert_intermediate_size = Field(0, checks.nonnegative_int, "the shared MLP's width (0: "
                                            "n_shared_experts * moe_intermediate_size)")
    shared_expert_gate = Field(False, checks.boolean, "the shared expert times sigmoid(x . g), g [H] (Qwen3-Next)")
    first_k_dense_replace = Field(0, checks.nonnegative_int, "the first k layers keep the dense MLP "
                                  "(DeepSeek-V3: 3, GLM-4.5: 3, Kimi K2: 1)")
    decoder_sparse_step = Field(1, checks.positive_int, "layer i is MoE only if (i + 1) % step == 0 (Qwen; "
                                "Llama 4 interleave_moe_layer_step)")
    mlp_only_layers = Field((), _layer_indices, "layers that keep the dense MLP (Qwen)", type=tuple)
    impl = Field("blocked", checks.one_of(*IMPLS),
                 "the routed experts: blocked (a batched matmul over blocks of rows sorted by expert, "
                 "posenc.expert_blocks) | ragged (jax.lax.ragged_dot, posenc.experts; dense on XLA:CPU) | "
                 "dense (every expert on every token: the reference)")
    router_aux_loss_coef = Field(0.01, checks.nonnegative, "weight of the load-balancing loss in training "
                                 "(Switch: 0.01; Mixtral 0.02, Qwen3-MoE 0.001; 0 = off)")
    router_z_loss_coef = Field(0.0, checks.nonnegative, "weight of the ST-MoE router z-loss in training "
                               "(ST-MoE, OLMoE: 0.001; 0 = off)")
    bias_update_rate = Field(1e-3, checks.nonnegative, "score_correction_bias: DeepSeek-V3's loss-free update "
                             "after every optimizer step, bias += rate * sign(mean load - load) (0 = off)")


@dataclasses.dataclass(frozen=True)
class MoESpec:
    """``model.moe`` resolved: the layers it applies to, the widths, the router and the loss weights."""

    num_experts: int
    top_k: int
    intermediate: int  # resolved (0 in the config: model.mlp_hidden)
    router: str
    norm_topk_prob: bool
    round_weights: bool
    n_group: int
    topk_group: int
    routed_scaling_factor: float
    score_correction_bias: bool
    router_bias: bool
    router_dtype: str
    expert_bias: bool
    glu: str
    swiglu_alpha: float
    swiglu_limit: float
    scale: str
    shared_intermediate: int  # resolved; 0: no shared expert
    shared_expert_gate: bool
    layers: tuple[bool, ...]  # per layer: MoE (True) or the dense MLP
    impl: str
    router_aux_loss_coef: float
    router_z_loss_coef: float
    bias_update_rate: float

    def router_keywords(self) -> dict:
        """The keywords of ``posenc.routing.ROUTERS[self.router]`` (the correction bias is passed per call)."""
        kw: dict = {"k": self.top_k}
        if self.router == "softmax_top_k":
            kw.update(normalize=self.norm_topk_prob, round_weights=self.round_weights)
        elif self.router == "sigmoid_top_k":
            kw.update(n_group=self.n_group, topk_group=self.topk_group, normalize=self.norm_topk_prob,
                      scaling=self.routed_scaling_factor)
        return kw


def _changed(m, defaults, field) -> bool:
    value = m[field]
    return (tuple(value) if isinstance(value, (list, tuple)) else value) != defaults[field]


def resolve(cfg, *, num_layers: int, mlp_hidden: int, sphere: bool) -> MoESpec | None:
    """``model.moe`` resolved (None with num_experts 0, when no other field of it may be set).

    ``mlp_hidden``: the dense MLP's resolved width; ``sphere``: nGPT's placement (refused).
    """
    m = cfg.get("moe")
    if m is None:
        return None
    defaults = MoE.config()
    if not m.num_experts:
        for field in defaults:
            if _changed(m, defaults, field):
                raise ValueError(f"model.moe.{field}={m[field]!r} is set, but the MoE is off "
                                 "(model.moe.num_experts=0); set num_experts > 0 or leave the field")
        return None
    E, k = int(m.num_experts), int(m.num_experts_per_tok)
    if k > E:
        raise ValueError(f"model.moe.num_experts_per_tok={k} must be <= model.moe.num_experts={E}")
    for field, routers in ROUTER_FIELDS.items():
        if m.router not in routers and _changed(m, defaults, field):
            raise ValueError(f"model.moe.{field}={m[field]!r} is set, but router {m.router!r} does not read "
                             f"it (it is read by: {', '.join(routers)})")
    if m.router == "sigmoid_top_k":
        _check_groups(E, k, int(m.n_group), int(m.topk_group))
    if m.glu != "clamped_swiglu":
        for field in ("swiglu_alpha", "swiglu_limit"):
            if _changed(m, defaults, field):
                raise ValueError(f"model.moe.{field}={m[field]!r} is set, but only glu 'clamped_swiglu' reads "
                                 f"it; got glu {m.glu!r}")
    if not m.score_correction_bias and _changed(m, defaults, "bias_update_rate"):
        raise ValueError(f"model.moe.bias_update_rate={m.bias_update_rate!r} moves the score correction "
                         "bias: it needs model.moe.score_correction_bias=True")
    if not m.n_shared_experts:
        for field in ("shared_expert_intermediate_size", "shared_expert_gate"):
            if _changed(m, defaults, field):
                raise ValueError(f"model.moe.{field}={m[field]!r} is set, but there is no shared expert "
                                 "(model.moe.n_shared_experts=0)")
    if sphere:
        raise ValueError("model.moe cannot be combined with model.norm.placement='ngpt' (nGPT scales and "
                         "renormalises one MLP per layer); choose another placement or num_experts=0")
    layers = _layers(m, num_layers)
    intermediate = int(m.moe_intermediate_size) or mlp_hidden
    shared = int(m.n_shared_experts) and (int(m.shared_expert_intermediate_size)
                                          or int(m.n_shared_experts) * intermediate)
    return MoESpec(
        num_experts=E, top_k=k, intermediate=intermediate, router=m.router, norm_topk_prob=bool(m.norm_topk_prob),
        round_weights=bool(m.round_weights), n_group=int(m.n_group), topk_group=int(m.topk_group),
        routed_scaling_factor=float(m.routed_scaling_factor), score_correction_bias=bool(m.score_correction_bias),
        router_bias=bool(m.router_bias), router_dtype=m.router_dtype, expert_bias=bool(m.expert_bias), glu=m.glu,
        swiglu_alpha=float(m.swiglu_alpha), swiglu_limit=float(m.swiglu_limit), scale=m.scale,
        shared_intermediate=shared, shared_expert_gate=bool(m.shared_expert_gate), layers=layers, impl=m.impl,
        router_aux_loss_coef=float(m.router_aux_loss_coef), router_z_loss_coef=float(m.router_z_loss_coef),
        bias_update_rate=float(m.bias_update_rate))


def _check_groups(E, k, n_group, topk_group) -> None:
    """DeepSeek-V3's group-limited choice (posenc.routing.sigmoid_top_k), with the fields' names."""
    if E % n_group:
        raise ValueError(f"model.moe.n_group={n_group} must divide model.moe.num_experts={E}")
    size = E // n_group
    if n_group > 1 and size < 2:
        raise ValueError(f"model.moe.n_group={n_group} leaves {size} expert per group; a group's score is "
                         "the sum of its top 2 experts, so each group needs at least 2")
    if topk_group > n_group:
        raise ValueError(f"model.moe.topk_group={topk_group} must be <= model.moe.n_group={n_group}")
    if k > topk_group * size:
        raise ValueError(f"model.moe.num_experts_per_tok={k} must be <= the experts of the kept groups "
                         f"(topk_group {topk_group} * {size} experts per group = {topk_group * size})")


def _layers(m, num_layers: int) -> tuple[bool, ...]:
    """Per layer: MoE or dense (the rule of the module docstring); ValueError if no layer is MoE."""
    only = tuple(m.mlp_only_layers)
    bad = [i for i in only if i >= num_layers]
    if bad:
        raise ValueError(f"model.moe.mlp_only_layers has index {bad[0]}, past the last layer "
                         f"(model.num_layers={num_layers})")
    first, step = int(m.first_k_dense_replace), int(m.decoder_sparse_step)
    layers = tuple(i >= first and (i + 1) % step == 0 and i not in only for i in range(num_layers))
    if not any(layers):
        raise ValueError(f"model.moe makes no layer MoE (first_k_dense_replace={first}, decoder_sparse_step="
                         f"{step}, mlp_only_layers={only} with model.num_layers={num_layers}); change one of them "
                         "or set num_experts=0")
    return layers
