"""What a layer's position unit may be combined with: the rules between units and the rest of the model.

Each rule reads a unit's declarations (``posenc.model.encoding.Encoding``:
``own_qk_norm``, ``rotates_in_attention``, ``qk_head_dim``, ``hides_keys``,
``own_attention``, ``has_kernel_form``) for every layer and raises
ValueError naming the layer, both fields and the fix. ``posenc.model.spec``
runs them once, when ``config.model`` is resolved, before anything compiles.
"""

from __future__ import annotations

from posenc.model import fused, registry

# Why a norm of q and k may not follow a unit that counter-scales them (Encoding.counter_scales_qk).
_COUNTER_SCALED = ("it scales q and k by reciprocal factors about an offset that cancels only in q . k, and "
                   "normalising the scaled q and k makes the logits depend on that offset (cached decoding "
                   "would differ from the full forward)")


def check_qk_norm(position, norm, *, head_dim) -> None:
    """A unit that normalises q and k itself (FoX (Pro)) and model.norm.qk_norm (or a placement that
    normalises q, k, v: HybridNorm) would do it twice; a unit that rotates inside attention (a
    remapped RoPE) leaves no rotated q, k to normalise, one that widens them (PoPE) leaves q, k
    wider than the norm's head_dim scales, and one that counter-scales them (xPos) would see its
    offset left in the logits of a QK-norm after it."""
    if norm.qkv_norm:
        _check_twice(position, f"model.norm.placement={norm.placement!r}", "choose another placement")
    if norm.qk_norm == "none":
        return
    for i, (k, opts) in enumerate(zip(position.layer_kinds, position.layer_options)):
        width = registry.get(k).qk_head_dim(opts, head_dim=head_dim)
        if width != head_dim and norm.qk_norm_after_rope:
            raise ValueError(f"model.norm.qk_norm_after_rope=True cannot follow position kind {k!r} "
                             f"(layer {i}): its queries and keys are {width} wide after the transform, "
                             f"the QK-norm's scales {head_dim}; set qk_norm_after_rope=False")
    for i, (k, opts) in enumerate(zip(position.layer_kinds, position.layer_options)):
        field = registry.get(k).rotates_in_attention(opts)
        if field and norm.qk_norm_after_rope:
            raise ValueError(f"model.norm.qk_norm_after_rope=True and model.position.{k}.{field}="
                             f"{opts[field]!r} cannot be combined (layer {i} rotates q and k per "
                             "(query, key) pair inside attention); set qk_norm_after_rope=False")
        if registry.get(k).counter_scales_qk(opts) and norm.qk_norm_after_rope:
            raise ValueError(f"model.norm.qk_norm_after_rope=True cannot follow position kind {k!r} (layer {i}): "
                             f"{_COUNTER_SCALED}; set qk_norm_after_rope=False")
    _check_twice(position, f"model.norm.qk_norm={norm.qk_norm!r}", "set model.norm.qk_norm='none'")


def _check_twice(position, what: str, fix: str) -> None:
    """``what`` normalises q and k: refuse a layer whose unit normalises them itself."""
    for i, (k, opts) in enumerate(zip(position.layer_kinds, position.layer_options)):
        field = registry.get(k).own_qk_norm(opts)
        if field:
            raise ValueError(f"{what} and model.position.{k}.{field} both normalise the queries and keys "
                             f"of layer {i}; {fix} or turn the unit's own QK-norm off")


def check_hidden_keys(position, norm) -> None:
    """Soft-capping maps a bias that hides keys (Hard-ALiBi's windows) to -cap: the keys come back."""
    if not norm.attn_softcap:
        return
    for i, (k, opts) in enumerate(zip(position.layer_kinds, position.layer_options)):
        field = registry.get(k).hides_keys(opts)
        if field:
            raise ValueError(f"model.norm.attn_softcap={norm.attn_softcap!r} and model.position.{k}."
                             f"{field}={opts[field]!r} cannot be combined: layer {i}'s bias hides keys, "
                             "and the soft-cap would map it to -cap and let them through; set "
                             "model.norm.attn_softcap=0")


def check_sinks(sinks: str, position) -> None:
    """Sinks join a softmax: a layer whose unit computes its own weights (stick-breaking, PaTH) has none."""
    if sinks == "none":
        return
    for i, k in enumerate(position.layer_kinds):
        if registry.get(k).own_attention():
            raise ValueError(f"model.attention_sinks={sinks!r} joins the softmax, but layer {i}'s position "
                             f"kind {k!r} computes its own attention weights; set model.attention_sinks='none'")


def check_sphere(position, *, head_dim) -> None:
    """nGPT (placement ngpt) normalises the rotated q and k of every head and scales them by s_qk [d]:
    a unit that normalises or rotates them inside attention, or widens them, leaves nothing to scale,
    and one that counter-scales them (xPos) would see its offset left in the normalised logits."""
    for i, (k, opts) in enumerate(zip(position.layer_kinds, position.layer_options)):
        unit = registry.get(k)
        field = unit.own_qk_norm(opts) or unit.rotates_in_attention(opts)
        if field or unit.qk_head_dim(opts, head_dim=head_dim) != head_dim:
            raise ValueError(f"model.norm.placement='ngpt' scales the rotated queries and keys, which position "
                             f"kind {k!r} (layer {i}) {'normalises or rotates inside attention' if field else 'widens'}"
                             f"{f' (model.position.{k}.{field})' if field else ''}; choose another kind")
        if unit.counter_scales_qk(opts):
            raise ValueError(f"model.norm.placement='ngpt' cannot be combined with position kind {k!r} (layer {i}): "
                             f"{_COUNTER_SCALED}; choose another kind or placement")


def check_kernel_form(impl: str, position) -> None:
    """``model.attention_impl``: "pallas" needs every layer's unit in the fused kernel; "auto" on a GPU /
    TPU tells (once per class) a unit whose bias has no in-kernel form that it keeps the XLA path."""
    if impl == "auto" and fused.on_accelerator():  # plugins told where it matters
        for kind in dict.fromkeys(position.layer_kinds):
            fused.tell_no_kernel_form(registry.get(kind))
    if impl == "pallas":
        no_kernel = [k for k, opts in zip(position.layer_kinds, position.layer_options)
                     if not registry.get(k).has_kernel_form() or registry.get(k).rotates_in_attention(opts)]
        if no_kernel:
            raise ValueError(f"model.attention_impl='pallas' needs encodings with an in-kernel "
                             f"form; {', '.join(dict.fromkeys(no_kernel))} has none (use 'auto')")
