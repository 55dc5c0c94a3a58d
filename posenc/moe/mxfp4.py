"""MXFP4 dequantization (NumPy, host side), bit for bit as transformers' ``convert_moe_packed_tensors``.

MXFP4 (OCP Microscaling Formats v1.0; gpt-oss checkpoints): each value is an
FP4 E2M1 number, two to a byte (the low nibble first), and each block of 32
values shares one E8M0 scale byte ``s``, the factor ``2 ** (s - 127)``::

    w[..., 32 g + 2 j]     = FP4_VALUES[blocks[..., g, j] & 0x0F] * 2 ** (scales[..., g] - 127)
    w[..., 32 g + 2 j + 1] = FP4_VALUES[blocks[..., g, j] >> 4]   * 2 ** (scales[..., g] - 127)

transformers (``integrations/mxfp4.py``, ``_convert_moe_packed_tensors``)
looks the nibbles up in a table of the output dtype and applies
``torch.ldexp(sub, scales - 127)``, an exact ``x * 2 ** e`` rounded once to
the output dtype. Here the same with ``np.ldexp`` in float32: every product
has at most 2 significant bits and is at least ``2 ** -128``, so float32 and
bfloat16 hold it exactly unless it reaches ``2 ** 128`` and overflows to inf
(at ``s = 255`` every nonzero value but +-0.5; zeros stay zero, no NaN);
float16 rounds to nearest even (tiny values to 0, large ones to inf), as
torch does.

Tensors of a gpt-oss checkpoint, per layer (``mlp.experts.*``)::

    gate_up_proj_blocks [E, 2I, H/32, 16] uint8   gate_up_proj_scales [E, 2I, H/32] uint8
    down_proj_blocks    [E, H, I/32, 16]  uint8   down_proj_scales    [E, H, I/32]  uint8

:func:`dequantize` gives the stored layout ``[E, 2I, H]`` / ``[E, H, I]``;
:func:`dequantize_experts` also swaps the last two axes, as transformers'
``out.transpose(1, 2).contiguous()`` does, giving ``[E, H, 2I]`` /
``[E, I, H]``: ``GptOssExperts``' ``gate_up_proj`` / ``down_proj`` layout,
which is ``posenc.experts``' layout (gate and up interleaved on the last
axis, for ``clamped_swiglu``). Both decode a bounded number of rows at a
time (``rows_per_chunk``; one expert) into a preallocated result, so a loader
can stream a checkpoint tensor by tensor with little more memory than the
result.

bfloat16 output needs the ``bfloat16`` NumPy dtype of ``ml_dtypes`` (which
jax imports): pass ``jnp.bfloat16`` or ``ml_dtypes.bfloat16``. This module
imports only NumPy.
"""

from __future__ import annotations

import math

import numpy as np

FP4_VALUES = (+0.0, +0.5, +1.0, +1.5, +2.0, +3.0, +4.0, +6.0,
              -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
"""The 16 FP4 E2M1 values by code (sign bit 3, exponent bits 2-1, mantissa bit 0), as transformers' table."""

BLOCK_SIZE = 32  # values per shared scale: 16 bytes

_LUT = np.array(FP4_VALUES, np.float32)
_DTYPES = ("float32", "bfloat16", "float16")


def _out_dtype(dtype) -> np.dtype:
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of: {', '.join(_DTYPES)} (bfloat16 as "
                         "jnp.bfloat16 or ml_dtypes.bfloat16)") from None
    if dt.name not in _DTYPES or dt.itemsize != {"float32": 4, "bfloat16": 2, "float16": 2}[dt.name]:
        raise ValueError(f"unknown dtype {dt.name!r}; choose one of: {', '.join(_DTYPES)}")
    return dt


def _check(blocks, scales) -> tuple[np.ndarray, np.ndarray]:
    blocks, scales = np.asarray(blocks), np.asarray(scales)
    if blocks.dtype != np.uint8 or scales.dtype != np.uint8:
        raise ValueError(f"blocks and scales must be uint8; got {blocks.dtype} and {scales.dtype}")
    if blocks.ndim < 2 or blocks.shape[:-1] != scales.shape:
        raise ValueError(f"blocks must have shape [..., G, B] and scales [..., G]; got {blocks.shape} and "
                         f"{scales.shape}")
    return blocks, scales


def _rows_into(out_rows, blocks, scales) -> None:
    """Dequantize ``blocks [n, G, B]``, ``scales [n, G]`` into ``out_rows [n, G * 2B]`` (any float dtype)."""
    n, g, b = blocks.shape
    values = np.empty((n, g, 2 * b), np.float32)
    values[..., 0::2] = _LUT[blocks & 0x0F]  # the low nibble first
    values[..., 1::2] = _LUT[blocks >> 4]
    exponents = scales.astype(np.int32)[..., None] - 127
    with np.errstate(over="ignore"):  # overflow to inf, as torch.ldexp
        values = np.ldexp(values, exponents).reshape(n, g * 2 * b)
    if out_rows.dtype.name == "bfloat16":
        # exact: every finite value has <= 2 significant bits and is >= 2 ** -128; inf keeps its top half
        out_rows.view(np.uint16)[...] = (values.view(np.uint32) >> 16).astype(np.uint16)
    else:
        with np.errstate(over="ignore"):  # float16: overflow to inf, as torch
            out_rows[...] = values  # float32 as is; float16 rounds to nearest even, as torch


def dequantize(blocks, scales, *, dtype=np.float32, rows_per_chunk: int = 1 << 16) -> np.ndarray:
    """MXFP4 blocks and scales to values, in the stored layout.

    ``rows_per_chunk`` rows of ``[G, B]`` bytes are decoded at a time (the
    float32 work space is ``rows_per_chunk * G * 2B`` values).

    Shapes: blocks uint8 ``[..., G, B]`` (B = 16), scales uint8 ``[..., G]``
    -> ``[..., G * 2B]`` in ``dtype`` (float32, bfloat16 or float16).
    """
    blocks, scales = _check(blocks, scales)
    dt = _out_dtype(dtype)
    *prefix, g, b = blocks.shape
    n = math.prod(prefix)
    out = np.empty((n, g * 2 * b), dt)
    flat_blocks, flat_scales = blocks.reshape(n, g, b), scales.reshape(n, g)
    step = max(1, int(rows_per_chunk))
    for r0 in range(0, n, step):
        _rows_into(out[r0:r0 + step], flat_blocks[r0:r0 + step], flat_scales[r0:r0 + step])
    return out.reshape(*prefix, g * 2 * b)


def dequantize_experts(blocks, scales, *, dtype=np.float32) -> np.ndarray:
    """transformers' ``convert_moe_packed_tensors``: dequantize, then swap the last two axes.

    ``[E, rows, G, B]`` -> ``[E, G * 2B, rows]``: ``gate_up_proj_blocks [E, 2I,
    H/32, 16]`` -> ``[E, H, 2I]``, ``down_proj_blocks [E, H, I/32, 16]`` ->
    ``[E, I, H]`` (see the module docstring). transformers' default dtype is
    bfloat16 (``dequantize_convertops`` passes no dtype); the result is
    contiguous. One expert is decoded at a time.

    Shapes: blocks uint8 ``[E, rows, G, B]``, scales uint8 ``[E, rows, G]`` -> ``[E, G * 2B, rows]``.
    """
    blocks, scales = _check(blocks, scales)
    if blocks.ndim != 4:
        raise ValueError(f"blocks must have shape [E, rows, G, B]; got {blocks.shape}")
    dt = _out_dtype(dtype)
    experts, rows, g, b = blocks.shape
    out = np.empty((experts, g * 2 * b, rows), dt)
    work = np.empty((rows, g * 2 * b), dt)
    for e in range(experts):
        _rows_into(work, blocks[e], scales[e])
        out[e] = work.T
    return out
