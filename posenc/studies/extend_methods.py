"""The context-extension methods of the extend study and the RoPE fields each sets at factor s.

A :class:`Method` is a posenc.rope scaling (PI, NTK, dynamic NTK, YaRN,
LongRoPE, Llama 3), a training-free remapping of the base's own RoPE
(Self-Extend, ReRoPE, DCA, STRING, StreamingLLM, LM-Infinite:
``model.position.rope.remap``) or a method that trains (PoSE, DroPE).
:data:`METHODS` names them; :func:`method_fields` gives the
``model.position.rope.*`` fields of one at factor s and training length L.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple


class Method(NamedTuple):
    """One extension method: its posenc.rope scaling, fixed fields and training-free remapping."""

    scaling: str | None  # the posenc.rope scaling kind (None: the base's own, for a remapping)
    extra: dict = {}  # further model.position.rope fields
    # (factor s, training length L) -> the model.position.rope remap fields (posenc.model.encodings.rope.REMAPS)
    remap: Callable[[float, int], dict] | None = None
    finetune: bool = True  # False: training-free only (no fine-tuning points)
    # (s, L) -> further run fields of its fine-tunes (a method that trains: PoSE's positions, DroPE's NoPE);
    # such a method has no zero-shot evaluation and fine-tunes at L, not at s L
    trains: Callable[[float, int], dict] | None = None


def _group(s: float) -> int:
    return max(1, int(round(2 * s)))


# method -> Method. The remappings' settings are the papers' rules at (s, L): Self-Extend's neighbor window
# W = L / 2 and group G = 2 s keep every grouped distance below L (W + (s L - W) / G < L; Jin et al. §3.3);
# ReRoPE's window w = L / 4 (bojone/rerope uses 512 of 2048 / 4096), Leaky ReRoPE's k = 2 s keeps w + (s L -
# w) / k < L; DCA's chunk 3/4 L and local window L / 8 (ChunkLlama's defaults); STRING's shift S = L / 3 and
# local window L / 8 (An et al. 2025: S in 0.25-0.4 L); StreamingLLM's 4 sinks and L - 5 recent keys (the
# query's slot stays below L); LM-Infinite's global branch 10 and local branch = limit = L (Han et al. §4).
METHODS = {
    "default": Method("default"),
    "linear": Method("linear"),
    "ntk": Method("ntk"),
    "dynamic": Method("dynamic"),  # factor 1: s = n / L at the current length n (emozilla)
    "yarn": Method("yarn"),  # temperature "paper": sqrt(1/t) = 0.1 ln s + 1
    "yarn_quadratic": Method("yarn", {"temperature": "quadratic"}),  # t = 1 + 0.1 ln s + 0.07 ln^2 s
    "dynamic_yarn": Method("dynamic_yarn"),
    "longrope": Method("longrope"),  # factors searched on the base model
    "llama3": Method("llama3"),
    "self_extend": Method(None, remap=lambda s, n: dict(remap="self_extend", group=_group(s),
                                                              window=max(1, n // 2)), finetune=False),
    "rerope": Method(None, remap=lambda s, n: dict(remap="rerope", window=max(1, n // 4)),
                     finetune=False),
    "leaky_rerope": Method(None, remap=lambda s, n: dict(remap="rerope", window=max(1, n // 4),
                                                               leaky=float(_group(s))), finetune=False),
    # DCA is also fine-tuned in its paper (ChunkLlama2 on long conversations)
    "dual_chunk": Method(None, remap=lambda s, n: dict(remap="dual_chunk", chunk=3 * n // 4,
                                                             local_window=n // 8)),
    "string": Method(None, remap=lambda s, n: dict(remap="string", shift=max(1, n // 3),
                                                         local_window=n // 8), finetune=False),
    "streaming_llm": Method(None, remap=lambda s, n: dict(remap="streaming_llm", sinks=4,
                                                                window=max(0, n - 5)), finetune=False),
    "lm_infinite": Method(None, remap=lambda s, n: dict(remap="lm_infinite", global_branch=10,
                                                              local_branch=n, limit=n), finetune=False),
    # PoSE (Zhu et al. 2024): fine-tune at L with positions skipping over s L (posenc.pose; the base's RoPE)
    "pose": Method(None, trains=lambda s, n: {"train.pose_length": int(round(s * n))}),
    # DroPE (Gelberg et al. 2025, SakanaAI/DroPE): the base with RoPE removed (NoPE, the same weights),
    # recalibrated by fine-tuning at L, then evaluated at s L
    "drope": Method(None, trains=lambda s, n: {"model.position.kind": "nope"}),
}
_ADAPTIVE = ("dynamic",)  # the scale follows the current length: no fixed factor


def method_fields(method: str, factor: float, original_length: int, longrope=None) -> dict:
    """The ``model.position.rope.*`` fields of ``method`` at factor s (``longrope``: a factor file).

    ``default`` changes nothing (the base's own RoPE: no scaling for a trained base, the
    checkpoint's own for ``base_hf``); a remapping (``Method.scaling`` None) sets its remap fields
    on the base's own RoPE (its scaling kept); every other method sets its scaling (and a remapping
    when it has one) and resets the options of other scalings and remappings to their defaults,
    whatever the base had.
    """
    from posenc.encodings.rope import rope_scaling
    from posenc.training import longrope as longrope_lib

    if method == "default":
        return {}
    m = METHODS[method]
    if m.trains is not None:
        fields = m.trains(float(factor), int(original_length))
        if "model.position.kind" in fields:  # the RoPE section goes with RoPE
            return fields
        return {**fields, **{f"model.position.rope.{k}": v for k, v in _resets(m).items()}}
    remapped = m.remap(float(factor), int(original_length)) if m.remap is not None else {}
    fields = {f"model.position.rope.{k}": v for k, v in remapped.items()}
    resets = _resets(m)
    if method == "longrope":
        if longrope is None:
            raise ValueError("method 'longrope' needs searched factors")
        fields.update(longrope_lib.rope_fields(longrope))
    if m.scaling is not None and method != "longrope":
        used = rope_scaling.KEYWORDS[m.scaling]
        fields["model.position.rope.scaling"] = m.scaling
        if "factor" in used and method not in _ADAPTIVE:
            fields["model.position.rope.factor"] = float(factor)
        if "original_length" in used:
            fields["model.position.rope.original_length"] = int(original_length)
        fields.update({f"model.position.rope.{k}": v for k, v in m.extra.items()})
    for name, default in resets.items():
        fields.setdefault(f"model.position.rope.{name}", default)
    return fields


def _resets(m: Method) -> dict:
    """The RoPE options ``m`` resets to their defaults: every remapping's, and every scaling's if it sets one."""
    from posenc.model.encodings import rope as rope_unit

    resets = dict(rope_unit.remap_defaults())
    if m.scaling is not None:
        resets.update(rope_unit.scaling_defaults())
    return resets



def zero_shot(method: str) -> bool:
    """Whether ``method`` has a zero-shot evaluation (a method that trains has not)."""
    return METHODS[method].trains is None
