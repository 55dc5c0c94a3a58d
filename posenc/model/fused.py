"""Attention of one encoding unit through the fused Pallas kernel (``posenc.kernels``).

FlashAttention-2 (Dao 2023) with the unit's logit terms evaluated per tile,
``s_ij = softcap(scale q_i . k_j + sum_t E^t_ij)``, so no [L, L] bias or
weight matrix exists, forward or backward (see ``posenc.kernels.flash``).

:func:`plan` says whether the kernel can run a call of
``posenc.model.attention.attention`` (its ``AttentionCall``) and builds the unit's terms
(``Encoding.kernel_terms``): the unit has an in-kernel form (no content
logits, no values; a bias only with ``kernel_terms``), no statistics are
asked for, the scale is a static float, a window comes with the causal
mask, and ``posenc.kernels.supported`` accepts the shapes and dtype.
:func:`attention` runs it, with the layer's window or chunk span. Compiled kernels
run on GPU (Triton) and TPU (Mosaic); elsewhere the kernel runs in the
Pallas interpreter, which is exact but slow (for tests), so
``attention_impl="auto"`` takes the kernel on accelerators only.
:func:`tell_no_kernel_form` warns once per class (:class:`NoKernelFormWarning`),
when a model of it is built for a GPU / TPU, that a unit with a ``bias`` but
no ``kernel_terms`` runs the XLA path there; on CPU, where every unit runs
the XLA path, nothing is said.
Shapes: q [B, Lq, H, Dh]; k, v [B, Lk, K, Dh]; positions int [B | 1, L].
"""

from __future__ import annotations

import contextlib
import warnings

import jax

from posenc import checks, kernels
from posenc.model.encoding import overrides

ACCELERATORS = ("gpu", "tpu")
_forced: list[str] = []  # the innermost force_backend's platform, if any


def platform() -> str:
    """The platform the kernel is built for: :func:`force_backend`'s, else the default device's
    ("gpu" for CUDA and ROCm; "gpu" | "tpu" | "cpu" | ...)."""
    if _forced:
        return _forced[-1]
    p = jax.default_backend()
    return {"cuda": "gpu", "rocm": "gpu"}.get(p, p)


@contextlib.contextmanager
def force_backend(backend: str):
    """Build the model's attention for ``backend`` ("gpu" | "tpu" | "cpu") whatever device this host has.

    "cpu" runs the kernel in the Pallas interpreter (exact, slow: for tests on any machine);
    "gpu" and "tpu" are what the model would trace on such a device. Inside those,
    ``attention_impl="auto"`` takes the compiled kernel (Triton on "gpu", Mosaic on
    "tpu", never the interpreter), ``dtype="auto"`` resolves to bfloat16 and
    ``supported()`` applies that backend's limits: what the model would trace on such a
    device. For lowering and compiling for an accelerator from a CPU host (``jax.export``
    with ``platforms=["cuda"]`` / ``["tpu"]``, or a TPU topology of ``libtpu``); a program
    traced inside cannot run on the CPU. Trace inside the context with functions jitted
    inside it: ``jax.jit`` caches traces by argument shapes, not by this setting.
    """
    _forced.append(checks.choice("backend", backend, ACCELERATORS + ("cpu",)))
    try:
        yield
    finally:
        _forced.pop()


def on_accelerator() -> bool:
    """Whether compiled kernels run here (GPU or TPU)."""
    return platform() in ACCELERATORS


class NoKernelFormWarning(UserWarning):
    """A unit's bias has no in-kernel form: on GPU / TPU its attention runs the XLA path."""


_TOLD: set[type] = set()  # classes already told (once per class)


def tell_no_kernel_form(cls) -> None:
    """Warn once per class that a ``bias`` without ``kernel_terms`` keeps the XLA path on GPU / TPU."""
    if cls in _TOLD or not overrides(cls, "bias") or overrides(cls, "kernel_terms"):
        return
    _TOLD.add(cls)
    others = [m for m in ("content_logits", "values", "feature_bias", "attention", "output",
                          "prepare") if overrides(cls, m)]
    advice = (f" (its {', '.join(others)} keep it there as well)" if others else
              "; define kernel_terms (posenc.kernels.score_term terms) for the fused kernel")
    warnings.warn(f"encoding {cls.name!r} ({cls.__module__}.{cls.__qualname__}) has a bias but no "
                  "kernel_terms: on GPU / TPU its attention runs the XLA path "
                  f"(posenc.model.attention), not the fused Pallas kernel{advice}",
                  NoKernelFormWarning, stacklevel=4)


def _backend():
    """(backend, interpret) for ``posenc.kernels``: compiled on accelerators, interpreted elsewhere."""
    p = platform()
    return (p, False) if p in ACCELERATORS else (None, True)


def plan(q, k, v, q_positions, k_positions, encoding, call):
    """``(terms, "")`` when the kernel can run this call (an ``AttentionCall``), else ``(None, why)``."""
    name = type(encoding).name or type(encoding).__name__
    if call.stats:
        return None, "statistics (max logit, entropy) are computed by the XLA path"
    if call.window and not call.causal:
        return None, "the kernel's window is causal (p - W < j) only, not symmetric"
    if not type(encoding).has_kernel_form():
        return None, (f"encoding {name!r} has no in-kernel form (content logits, values, "
                      "or a bias without kernel_terms)")
    if isinstance(call.scale, jax.core.Tracer):
        return None, "the logit scale is traced (the kernel takes a static float)"
    if v.shape[-1] > q.shape[-1]:
        return None, f"values wider than the queries ({v.shape[-1]} > {q.shape[-1]}: the kernel takes Dv <= Dh)"
    if not (q.dtype == k.dtype == v.dtype):
        return None, f"q, k, v dtypes differ ({q.dtype}, {k.dtype}, {v.dtype})"
    terms = encoding.kernel_terms(q_positions, k_positions)
    if terms is None:
        return None, f"encoding {name!r} returned no kernel terms"
    terms = kernels.score_term.as_terms(terms)
    backend, interpret = _backend()
    ok, why = kernels.supported(q.shape, k.shape, dtype=q.dtype, score_terms=terms,
                                backend=backend, interpret=interpret)
    return (terms, "") if ok else (None, why)


def attention(q, k, v, q_positions, k_positions, terms, call):
    """``posenc.kernels.flash_attention`` with the terms of :func:`plan`; -> [B, Lq, H, Dh] in q.dtype.

    ``call``: the ``AttentionCall`` (scale, mask, offsets, soft-cap, sinks; its window / chunk
    span masks are those of ``posenc.model.attention``, and the kernel skips the key
    blocks outside them).
    """
    backend, interpret = _backend()
    if q_positions.ndim == 3:  # several axes (M-RoPE, 2D RoPE): no score terms read them
        if terms:
            raise ValueError("the kernel's score terms read one position axis; got positions "
                             f"{q_positions.shape} of several")
        q_positions, k_positions = q_positions[..., 0], k_positions[..., 0]
    return kernels.flash_attention(
        q, k, v, q_positions=q_positions, k_positions=k_positions, score_terms=terms,
        scale=float(call.scale), causal=call.causal, q_offset=call.q_offset,
        kv_length=call.kv_length, softcap=float(call.softcap), window=call.window or None,
        chunk=call.chunk or None, sinks=call.sinks, backend=backend, interpret=interpret)
