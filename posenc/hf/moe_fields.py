"""The ``config.json`` fields of mixture-of-experts layers as ``model.moe.*`` (posenc.model.moe).

:func:`moe` reads the expert count (each family's key: ``num_local_experts``,
``num_experts``, ``n_routed_experts``), ``num_experts_per_tok``, the experts'
width, which layers are MoE and the router options the family's config
carries; the family's preset (``posenc.model.presets``) gives the router
itself. What a config asks that posenc's MoE does not compute is refused in
one line naming the field.
"""

from __future__ import annotations

from posenc.hf.registry import unsupported

EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")


def num_experts(hf: dict) -> int:
    """The routed experts of a config (the first of :data:`EXPERT_KEYS` it has; 0 if none)."""
    for key in EXPERT_KEYS:
        if hf.get(key):
            return int(hf[key])
    return 0


def moe(hf: dict, out: dict, *, width_key="moe_intermediate_size", options=()) -> None:
    """Set ``model.moe.*`` of ``out`` from ``hf``: the expert count, top-k, the experts' width
    (``hf[width_key]``), which layers are MoE (``decoder_sparse_step``, ``mlp_only_layers``,
    ``first_k_dense_replace`` where the config has them) and the config's ``options``
    (fields of the same name in ``model.moe``, e.g. ``norm_topk_prob``)."""
    E = num_experts(hf)
    if not E:
        raise unsupported(hf, EXPERT_KEYS[0], "a mixture-of-experts family needs its experts' count")
    out["model.moe.num_experts"] = E
    out["model.moe.num_experts_per_tok"] = int(hf.get("num_experts_per_tok", out.get(
        "model.moe.num_experts_per_tok", 2)))
    out["model.moe.moe_intermediate_size"] = int(hf[width_key])
    if hf.get("decoder_sparse_step") is not None:
        out["model.moe.decoder_sparse_step"] = int(hf["decoder_sparse_step"])
    if hf.get("mlp_only_layers"):
        out["model.moe.mlp_only_layers"] = tuple(int(i) for i in hf["mlp_only_layers"])
    if hf.get("first_k_dense_replace") is not None:
        out["model.moe.first_k_dense_replace"] = int(hf["first_k_dense_replace"])
    for name in options:
        if hf.get(name) is not None:
            value = hf[name]
            out[f"model.moe.{name}"] = value if isinstance(value, (bool, int)) else float(value)
    if hf.get("router_aux_loss_coef") is not None:
        out["model.moe.router_aux_loss_coef"] = float(hf["router_aux_loss_coef"])
