"""The float32 arithmetic behind :mod:`posenc.rope_scaling`, in HF's order of operations.

HuggingFace transformers ``modeling_rope_utils`` computes some scalars as
Python floats (the NTK base, the YaRN correction range, every attention
factor) and the rest in float32 tensors (``arange / d``, ``base **
exponent``, the YaRN ramp and mix, the Llama 3 wavelengths and smoothing).
These functions do the same, on the host with NumPy: Python float64 where HF
has Python floats, float32 where HF has float32 tensors. The parts that may
depend on a traced sequence length take jnp scalars. Arguments are assumed
valid (``posenc.rope_scaling`` checks them).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

F32 = np.float32

# YaRN attention-temperature formulas (see posenc.rope_scaling.yarn).
TEMPERATURES = ("paper", "quadratic")


def exponents(d: int) -> np.ndarray:
    """float32 ``2i / d`` for i = 0..d/2-1; HF: ``torch.arange(0, d, 2).float() / d``."""
    return np.arange(0, d, 2, dtype=np.int64).astype(F32) / F32(d)


def powf(base: float, exps: np.ndarray) -> np.ndarray:
    """float32 ``base ** exps``, correctly rounded.

    The float32 base raised in float64 and rounded once: this agrees with
    torch's float32 pow (the canonical implementations) on ~99% of entries
    and is within 1 ulp elsewhere, where NumPy's float32 pow differs on ~16%
    and XLA's loses ~|ln base| ulps.
    """
    return (np.float64(F32(base)) ** exps.astype(np.float64)).astype(F32)


def default_inv_freq(base: float, d: int) -> np.ndarray:
    """``1 / base^(2i/d)`` in float32, as HF: ``1.0 / (base ** (arange(0, d, 2) / d))``."""
    return F32(1.0) / powf(base, exponents(d))


def proportional_inv_freq(base: float, head_dim: int, fraction: float, factor: float) -> np.ndarray:
    """p-RoPE: ``head_dim // 2`` entries, the first ``int(fraction * head_dim // 2)`` rotated.

    As HF ``_compute_proportional_rope_parameters``: ``1 / base ** (arange(0,
    2k, 2) / head_dim)`` for the k rotated pairs, float32 zeros after them,
    the whole divided by ``factor`` (zeros stay zeros).
    """
    k = int(fraction * head_dim // 2)  # Python precedence: (fraction * head_dim) // 2
    inv = np.zeros(head_dim // 2, dtype=F32)
    inv[:k] = default_inv_freq(base, head_dim)[:k]
    return inv / F32(factor)


def dynamic_inv_freq_traced(base, factor, original_length, n, d):
    """Dynamic NTK frequencies for a jax-array sequence length (float32).

    base'^(-2i/d) = base^(-2i/d) * ratio^(-(d/(d-2)) 2i/d): the large,
    concrete part stays exact and only the small log(ratio) is traced.
    """
    n = jnp.maximum(n, original_length).astype(jnp.float32)
    ratio = (factor * n / original_length) - (factor - 1)
    log_scale = -(d / (d - 2)) * jnp.log(ratio) * jnp.asarray(exponents(d))
    return jnp.asarray(default_inv_freq(base, d)) * jnp.exp(log_scale)


def mscale(scale, k=1.0):
    """YaRN magnitude correction 0.1 k ln(s) + 1 (1 when s <= 1)."""
    if isinstance(scale, jax.Array):
        # Traced dynamic_yarn factor; it is >= 1 by construction, where the
        # formula already gives 1 at s = 1.
        return 0.1 * k * jnp.log(scale) + 1.0
    if scale <= 1:
        return 1.0
    return 0.1 * k * math.log(scale) + 1.0


def yarn_attention_factor(factor, mscale_, mscale_all_dim, temperature="paper"):
    """YaRN attention factor (multiplies cos and sin; logits scale by its square).

    "paper": HF's rule, m(s, mscale) / m(s, mscale_all_dim) when both are
    set and non-zero, else m(s) = 0.1 ln s + 1. "quadratic": sqrt(1 + 0.1
    ln s + 0.07 ln^2 s) (1 when s <= 1).
    """
    if temperature == "quadratic":
        if isinstance(factor, jax.Array):
            log_s = jnp.log(factor)  # >= 0: traced factors are max(1, n / L)
            return jnp.sqrt(1.0 + 0.1 * log_s + 0.07 * log_s**2)
        if factor <= 1:
            return 1.0
        log_s = math.log(factor)
        return math.sqrt(1.0 + 0.1 * log_s + 0.07 * log_s**2)
    if mscale_ and mscale_all_dim:
        return mscale(factor, mscale_) / mscale(factor, mscale_all_dim)
    return mscale(factor)


def yarn_inv_freq(d, base, factor, original_length, beta_fast, beta_slow, truncate):
    """YaRN "NTK-by-parts" frequencies; `factor` may be a float or a jnp scalar."""

    def correction_dim(rotations):
        # Pair index whose wavelength fits `rotations` turns into the original length.
        return (d * math.log(original_length / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    # The clamp uses d - 1 although the ramp has d // 2 entries (as in HF).
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001  # avoid 0 / 0
    ramp = np.clip((np.arange(d // 2, dtype=F32) - F32(low)) / F32(high - low), 0, 1).astype(F32)

    pos_freqs = powf(base, exponents(d))
    inv_extrapolation = F32(1.0) / pos_freqs
    if isinstance(factor, jax.Array):  # traced dynamic_yarn factor
        inv_interpolation = 1.0 / (factor * jnp.asarray(pos_freqs))
    else:
        inv_interpolation = F32(1.0) / (F32(factor) * pos_freqs)
    extrapolation_weight = F32(1) - ramp
    return inv_interpolation * (F32(1) - extrapolation_weight) + inv_extrapolation * extrapolation_weight


def llama3_inv_freq(d, base, factor, original_length, low_freq_factor, high_freq_factor):
    """Llama 3.1 per-band frequencies (float32, as HF ``_compute_llama3_parameters``)."""
    # HF compares and combines float32 tensors with Python scalars, which
    # torch rounds to float32 first; the explicit casts do the same.
    inv_freq = default_inv_freq(base, d)
    low_freq_wavelen = F32(original_length / low_freq_factor)
    high_freq_wavelen = F32(original_length / high_freq_factor)
    wavelen = F32(2 * math.pi) / inv_freq
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / F32(factor), inv_freq)
    smooth = (F32(original_length) / wavelen - F32(low_freq_factor)) / F32(
        high_freq_factor - low_freq_factor
    )
    smoothed = (F32(1) - smooth) * scaled / F32(factor) + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return np.where(is_medium, smoothed, scaled)
