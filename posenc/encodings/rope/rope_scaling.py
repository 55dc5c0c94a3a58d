"""RoPE inverse frequencies with context-extension scaling.

One public function per scaling kind, each taking exactly its keywords:
:func:`default` (Su et al. 2021), :func:`linear` (position interpolation,
Chen et al. 2023), :func:`ntk` and :func:`dynamic` (NTK-aware and dynamic
NTK, bloc97, emozilla 2023), :func:`yarn` and :func:`dynamic_yarn` (Peng et
al. 2023), :func:`longrope` (Ding et al. 2024), :func:`llama3` (Dubey et
al. 2024) and :func:`proportional` (p-RoPE, Barbero et al. 2025). Each
returns ``(inv_freq, attention_factor)``. :func:`frequencies` dispatches to
them by kind name; ``posenc.rope`` re-exports it.

Facts a caller (e.g. the model's config validation) derives its rules from,
all read off the per-kind signatures so they cannot drift apart:

- :data:`KEYWORDS`: kind -> the keywords of ``frequencies`` that kind uses;
- :data:`NEEDS_ORIGINAL_LENGTH`: kinds that raise without ``original_length``;
- :data:`DEPENDS_ON_SEQ_LEN`: kinds whose result depends on the current
  length ``seq_len`` (the largest position + 1, cached keys included; HF's
  ``max(position_ids) + 1``): "dynamic" and "dynamic_yarn" change
  continuously once seq_len > original_length, "longrope" switches from
  ``short_factor`` to ``long_factor`` at seq_len > original_length (as
  HF's ``longrope_frequency_update``). Up to original_length all three give
  what they give at initialisation. A decoder with a KV cache must decide
  what keys rotated under the other frequencies mean (HF keeps them).

The arithmetic (:mod:`posenc.rope_scaling_math`) mirrors HuggingFace
transformers ``modeling_rope_utils`` bit for bit where it can: Python
float64 where HF has Python floats, float32 where HF has float32 tensors,
in the same order of operations, on the host; a jax-array ``seq_len``
switches the parts that depend on it to float32 jnp so it can be traced.

Convention: :func:`posenc.rope.apply` multiplies cos and sin by
``attention_factor``, so attention logits scale by ``attention_factor ** 2``.

Shapes: ``inv_freq`` is float32 ``[rotary_dim // 2]`` (``[head_dim // 2]``
for "proportional").
"""

from __future__ import annotations

import inspect
import math
import numbers

import jax
import jax.numpy as jnp
import numpy as np

from posenc import checks
from posenc.encodings.rope import rope_scaling_math as _m

KINDS = ("default", "linear", "ntk", "dynamic", "yarn", "dynamic_yarn", "longrope", "llama3",
         "proportional")
TEMPERATURES = _m.TEMPERATURES  # YaRN attention-temperature formulas (see :func:`yarn`)


def _check_positive(name: str, value, allowed: str = "a positive number") -> float:
    checks.static(name, value)
    if not checks.is_real(value) or not value > 0 or not math.isfinite(value):
        raise ValueError(f"{name} must be {allowed}; got {value!r}")
    return float(value)


def _check_rotary_dim(kind: str, rotary_dim, name: str = "rotary_dim") -> int:
    if isinstance(rotary_dim, bool) or not isinstance(rotary_dim, numbers.Integral):
        raise ValueError(f"{name} must be a positive even integer; got {rotary_dim!r}")
    d = int(rotary_dim)
    if d <= 0 or d % 2:
        raise ValueError(f"{name} must be a positive even integer; got {d}")
    if kind in ("ntk", "dynamic") and d < 4:
        # The NTK exponent d / (d - 2) is undefined at d = 2.
        raise ValueError(f"rotary_dim must be an even integer >= 4 for kind {kind!r}; got {d}")
    return d


def _seq_len_value(kind: str, seq_len):
    """Return a Python int, or the jax array itself (traced or not)."""
    if isinstance(seq_len, jax.Array):
        if seq_len.ndim != 0 or not jnp.issubdtype(seq_len.dtype, jnp.integer):
            raise ValueError(
                f"seq_len must be an integer scalar; got a jax array of shape {seq_len.shape} "
                f"and dtype {seq_len.dtype}"
            )
        return seq_len
    if isinstance(seq_len, np.ndarray) and seq_len.ndim == 0:
        seq_len = seq_len.item()
    if isinstance(seq_len, bool) or not isinstance(seq_len, numbers.Integral) or seq_len < 1:
        raise ValueError(f"seq_len must be a positive integer; got {seq_len!r}")
    return int(seq_len)


def _check_factors(name: str, values, half: int) -> np.ndarray:
    if values is None:
        raise ValueError(f"kind 'longrope' needs {name} (a sequence of {half} numbers); got None")
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1 or arr.shape[0] != half:
        raise ValueError(
            f"{name} must have rotary_dim // 2 = {half} entries; got shape {arr.shape} "
            f"({arr.size} entries)"
        )
    if not np.all(np.isfinite(arr)) or not np.all(arr > 0):
        raise ValueError(f"{name} entries must be positive and finite; got {values!r}")
    return arr.astype(_m.F32)


def _check_factor(factor) -> float:
    checks.static("factor", factor)
    if not checks.is_real(factor) or not math.isfinite(factor) or factor < 1:
        raise ValueError(f"factor must be a number >= 1; got {factor!r}")
    return float(factor)


def _check_base(kind: str, base) -> float:
    base = _check_positive("base", base)
    if kind in ("yarn", "dynamic_yarn") and base == 1.0:
        raise ValueError(f"base must be a positive number other than 1 for kind {kind!r}; got {base!r}")
    return base


def _check_original_length(kind: str, original_length):
    if original_length is None:
        raise ValueError(f"kind {kind!r} needs original_length (the training context length); got None")
    original_length = _check_positive("original_length", original_length)
    return int(original_length) if original_length == int(original_length) else original_length


def _check_attention_factor(attention_factor):
    return None if attention_factor is None else _check_positive("attention_factor", attention_factor)


def _current_length(kind: str, seq_len, original_length):
    # No seq_len (e.g. at initialisation): the original length, as in HF,
    # i.e. default frequencies (dynamic), factor 1 (dynamic_yarn) and the
    # short factors (longrope).
    return original_length if seq_len is None else _seq_len_value(kind, seq_len)


def _result(inv_freq, attention_factor):
    return jnp.asarray(inv_freq, dtype=jnp.float32), attention_factor


# ---------------------------------------------------------------------------
# One function per kind. Notation: d = rotary_dim, i = 0..d/2-1, s = factor,
# L = original_length, n = seq_len, inv_i = 1 / base^(2i/d).
# ---------------------------------------------------------------------------


def default(rotary_dim, *, base=10000.0):
    """RoPE (Su et al. 2021, RoFormer): inv_i = 1 / base^(2i/d); attention factor 1."""
    d = _check_rotary_dim("default", rotary_dim)
    return _result(_m.default_inv_freq(_check_base("default", base), d), 1.0)


def linear(rotary_dim, *, base=10000.0, factor=1.0):
    """Position interpolation (Chen et al. 2023): inv_i / s; attention factor 1."""
    d = _check_rotary_dim("linear", rotary_dim)
    base, factor = _check_base("linear", base), _check_factor(factor)
    return _result(_m.default_inv_freq(base, d) / _m.F32(factor), 1.0)


def ntk(rotary_dim, *, base=10000.0, factor=1.0):
    """NTK-aware scaling (bloc97 2023): base' = base * s^(d/(d-2)); attention factor 1."""
    d = _check_rotary_dim("ntk", rotary_dim)
    base, factor = _check_base("ntk", base), _check_factor(factor)
    return _result(_m.default_inv_freq(base * factor ** (d / (d - 2)), d), 1.0)


def dynamic(rotary_dim, *, base=10000.0, factor=1.0, original_length=None, seq_len=None):
    """Dynamic NTK (emozilla 2023): base' = base * (s n'/L - (s - 1))^(d/(d-2)), n' = max(n, L).

    Default frequencies while n <= L. Keys already in a KV cache keep the
    rotation of the base they were written with (as in HF); the decoder
    decides how to handle that. `seq_len` may be a traced integer scalar.
    """
    d = _check_rotary_dim("dynamic", rotary_dim)
    base, factor = _check_base("dynamic", base), _check_factor(factor)
    original_length = _check_original_length("dynamic", original_length)
    n = _current_length("dynamic", seq_len, original_length)
    if isinstance(n, jax.Array):
        return _result(_m.dynamic_inv_freq_traced(base, factor, original_length, n, d), 1.0)
    n = max(n, original_length)  # n <= L: default frequencies
    new_base = base * ((factor * n / original_length) - (factor - 1)) ** (d / (d - 2))
    return _result(_m.default_inv_freq(new_base, d), 1.0)


def _check_yarn_options(beta_fast, beta_slow, mscale, mscale_all_dim, truncate, temperature,
                        attention_factor):
    checks.choice("temperature", temperature, TEMPERATURES)
    if temperature == "quadratic" and (attention_factor is not None or (mscale and mscale_all_dim)):
        raise ValueError(
            "temperature='quadratic' computes the attention factor itself; it cannot be combined "
            f"with attention_factor={attention_factor!r} or with mscale={mscale!r} and "
            f"mscale_all_dim={mscale_all_dim!r} (leave them at None)"
        )
    beta_fast = _check_positive("beta_fast", beta_fast)
    beta_slow = _check_positive("beta_slow", beta_slow)
    if beta_fast < beta_slow:
        raise ValueError(
            f"beta_fast must be >= beta_slow; got beta_fast={beta_fast!r}, beta_slow={beta_slow!r}"
        )
    for name, value in (("mscale", mscale), ("mscale_all_dim", mscale_all_dim)):
        if value is not None and (not checks.is_real(value) or not math.isfinite(value)):
            raise ValueError(f"{name} must be None or a finite number; got {value!r}")
    return beta_fast, beta_slow, bool(truncate)


def yarn(rotary_dim, *, base=10000.0, factor=1.0, original_length=None, beta_fast=32.0,
         beta_slow=1.0, mscale=None, mscale_all_dim=None, truncate=True, attention_factor=None,
         temperature="paper"):
    """YaRN "NTK-by-parts" (Peng et al. 2023) with its attention factor.

    A ramp between inv_i / s (low frequencies) and inv_i (high frequencies)
    over the pair range [low, high] given by corr(r) = d ln(L / (2 pi r)) /
    (2 ln base) at r = beta_fast, beta_slow (floor / ceil when `truncate`).

    Attention factor a (cos and sin are multiplied by a, logits by a^2):

    - temperature="paper" (default; the paper's sqrt(1/t) = 0.1 ln s + 1 and
      HF): a = 0.1 ln s + 1 (1 when s <= 1), or m(s, mscale) /
      m(s, mscale_all_dim) with m(s, k) = 0.1 k ln s + 1 when both are set
      and non-zero (HF rule; one alone is ignored); an explicit
      `attention_factor` overrides both.
    - temperature="quadratic": the fit t = 1 + 0.1 ln s + 0.07 ln^2 s that
      some write-ups give, read as the logit multiplier (read as the paper's
      t, which divides the logits, it would soften attention as s grows, the
      opposite of YaRN's intent): a = sqrt(1 + 0.1 ln s + 0.07 ln^2 s). It
      refuses `attention_factor` and the mscale pair.

    Logit multiplier a^2 by formula:

        s           2       4       8       16
        paper       1.1434  1.2965  1.4591  1.6314    (0.1 ln s + 1)^2
        quadratic   1.1029  1.2732  1.5106  1.8154    1 + 0.1 ln s + 0.07 ln^2 s

    They cross at ln s = 5/3 (s ~ 5.3): the quadratic one is milder below, sharper above.
    """
    d = _check_rotary_dim("yarn", rotary_dim)
    base, factor = _check_base("yarn", base), _check_factor(factor)
    attention_factor = _check_attention_factor(attention_factor)
    original_length = _check_original_length("yarn", original_length)
    beta_fast, beta_slow, truncate = _check_yarn_options(
        beta_fast, beta_slow, mscale, mscale_all_dim, truncate, temperature, attention_factor)
    inv_freq = _m.yarn_inv_freq(d, base, factor, original_length, beta_fast, beta_slow, truncate)
    if attention_factor is None:
        attention_factor = float(_m.yarn_attention_factor(factor, mscale, mscale_all_dim,
                                                          temperature))
    return _result(inv_freq, attention_factor)


def dynamic_yarn(rotary_dim, *, base=10000.0, original_length=None, seq_len=None, beta_fast=32.0,
                 beta_slow=1.0, mscale=None, mscale_all_dim=None, truncate=True,
                 attention_factor=None, temperature="paper"):
    """:func:`yarn` with s = max(1, n / L) recomputed from the current length n.

    There is no `factor`: it is derived. With a jax-array `seq_len` and no
    explicit `attention_factor`, the attention factor is a float32 jnp
    scalar; otherwise a Python float.
    """
    d = _check_rotary_dim("dynamic_yarn", rotary_dim)
    base = _check_base("dynamic_yarn", base)
    attention_factor = _check_attention_factor(attention_factor)
    original_length = _check_original_length("dynamic_yarn", original_length)
    n = _current_length("dynamic_yarn", seq_len, original_length)
    beta_fast, beta_slow, truncate = _check_yarn_options(
        beta_fast, beta_slow, mscale, mscale_all_dim, truncate, temperature, attention_factor)
    if isinstance(n, jax.Array):
        factor = jnp.maximum(1.0, n.astype(jnp.float32) / original_length)
    else:
        factor = max(1.0, n / original_length)
    inv_freq = _m.yarn_inv_freq(d, base, factor, original_length, beta_fast, beta_slow, truncate)
    if attention_factor is None:
        attention_factor = _m.yarn_attention_factor(factor, mscale, mscale_all_dim, temperature)
        if not isinstance(attention_factor, jax.Array):
            attention_factor = float(attention_factor)
    return _result(inv_freq, attention_factor)


def longrope(rotary_dim, *, base=10000.0, factor=1.0, original_length=None, seq_len=None,
             short_factor=None, long_factor=None, attention_factor=None):
    """LongRoPE (Ding et al. 2024, Phi-3): inv_i / lambda_i, per-pair rescale factors.

    lambda = long_factor when n > L, else short_factor (d/2 entries each).
    `factor` is max_position_embeddings / original_max_position_embeddings
    and only gives the attention factor sqrt(1 + ln s / ln L) (1 when
    s <= 1), unless `attention_factor` is given.
    """
    d = _check_rotary_dim("longrope", rotary_dim)
    base, factor = _check_base("longrope", base), _check_factor(factor)
    attention_factor = _check_attention_factor(attention_factor)
    original_length = _check_original_length("longrope", original_length)
    n = _current_length("longrope", seq_len, original_length)
    half = d // 2
    short = _check_factors("short_factor", short_factor, half)
    long = _check_factors("long_factor", long_factor, half)
    if attention_factor is None:
        if factor <= 1.0:
            attention_factor = 1.0
        elif original_length <= 1:
            raise ValueError(f"original_length must be > 1 for kind 'longrope'; got {original_length!r}")
        else:
            attention_factor = math.sqrt(1 + math.log(factor) / math.log(original_length))
    shape = _m.powf(base, _m.exponents(d))
    inv_short, inv_long = _m.F32(1.0) / (short * shape), _m.F32(1.0) / (long * shape)
    if isinstance(n, jax.Array):
        return _result(jnp.where(n > original_length, inv_long, inv_short), float(attention_factor))
    return _result(inv_long if n > original_length else inv_short, float(attention_factor))


def llama3(rotary_dim, *, base=10000.0, factor=1.0, original_length=None, low_freq_factor=1.0,
           high_freq_factor=4.0):
    """Llama 3.1 (Dubey et al. 2024): per-band scaling by wavelength w_i = 2 pi / inv_i.

    inv_i / s where w_i > L / low_freq_factor, inv_i where w_i < L /
    high_freq_factor, and in between (1 - t) inv_i / s + t inv_i with
    t = (L / w_i - low_freq_factor) / (high_freq_factor - low_freq_factor).
    Attention factor 1.
    """
    d = _check_rotary_dim("llama3", rotary_dim)
    base, factor = _check_base("llama3", base), _check_factor(factor)
    original_length = _check_original_length("llama3", original_length)
    low_freq_factor = _check_positive("low_freq_factor", low_freq_factor)
    high_freq_factor = _check_positive("high_freq_factor", high_freq_factor)
    if low_freq_factor >= high_freq_factor:
        raise ValueError(
            "low_freq_factor must be < high_freq_factor; got "
            f"low_freq_factor={low_freq_factor!r}, high_freq_factor={high_freq_factor!r}"
        )
    return _result(_m.llama3_inv_freq(d, base, factor, original_length, low_freq_factor,
                                    high_freq_factor), 1.0)


def proportional(head_dim, *, base=10000.0, factor=1.0, fraction=1.0):
    """p-RoPE (Barbero et al. 2025, arXiv 2410.06205) = HF's "proportional" rope type.

    k = int(fraction * head_dim // 2) pairs keep inv_i = 1 / base^(2i /
    head_dim) (i < k); the other head_dim / 2 - k are 0, i.e. not rotated:
    the lowest frequencies are the ones dropped. All are divided by `factor`.
    The first argument is the head dim and inv_freq has head_dim // 2
    entries, so :func:`posenc.rope.apply` rotates the whole head with pairs
    (i, i + head_dim / 2) in the "half" layout, as HF does; the zero pairs
    pass through unchanged. fraction = 0 is NoPE, 1 is "default" / "linear".

    Not GPT-NeoX's rotary fraction (``rotary_pct``; HF
    ``partial_rotary_factor`` for every other kind, here
    ``frequencies(kind, posenc.rope.rotary_dim(head_dim, fraction))``): that
    rotates the first rotary_dim = int(fraction * head_dim) dims with
    inv_i = 1 / base^(2i / rotary_dim), frequencies recomputed over the
    rotary width, so the frequency set differs (head_dim 8, fraction 0.5,
    base 1e4: p-RoPE [1, 0.1, 0, 0], NeoX [1, 0.01]) and so, in the "half"
    layout, do the pairs ((i, i + 4) against (i, i + 2)). Libraries have
    shipped silent mixes of the two (HF #48101 / #48652, pie-project/pie#603).
    """
    d = _check_rotary_dim("proportional", head_dim, "head_dim")
    base, factor = _check_base("proportional", base), _check_factor(factor)
    fraction = checks.number("fraction", fraction, minimum=0.0, maximum=1.0)
    return _result(_m.proportional_inv_freq(base, d, fraction, factor), 1.0)


SCALINGS = {"default": default, "linear": linear, "ntk": ntk, "dynamic": dynamic, "yarn": yarn,
            "dynamic_yarn": dynamic_yarn, "longrope": longrope, "llama3": llama3,
            "proportional": proportional}


def _keywords(fn) -> tuple[str, ...]:
    return tuple(p.name for p in inspect.signature(fn).parameters.values()
                 if p.kind is inspect.Parameter.KEYWORD_ONLY)


# kind -> the keywords it takes (those of its function above).
KEYWORDS = {kind: _keywords(SCALINGS[kind]) for kind in KINDS}
NEEDS_ORIGINAL_LENGTH = tuple(k for k in KINDS if "original_length" in KEYWORDS[k])
DEPENDS_ON_SEQ_LEN = tuple(k for k in KINDS if "seq_len" in KEYWORDS[k])


def frequencies(
    kind,
    rotary_dim,
    *,
    base=10000.0,
    factor=1.0,
    original_length=None,
    seq_len=None,
    beta_fast=32.0,
    beta_slow=1.0,
    mscale=None,
    mscale_all_dim=None,
    truncate=True,
    short_factor=None,
    long_factor=None,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    attention_factor=None,
    fraction=1.0,
    temperature="paper",
):
    """RoPE inverse frequencies and attention factor for one scaling kind.

    Calls the function of that kind (:data:`SCALINGS`; formulas in their
    docstrings) with the keywords it takes (:data:`KEYWORDS`). A keyword
    counts as given when its value differs from its default here (``None``,
    or the number, bool or string shown); a given keyword the kind does not use
    raises ValueError naming the keywords the kind takes. So a caller may
    forward a full set of keywords whose unused ones sit at their defaults,
    but ``frequencies("linear", d, original_length=4096)`` is refused rather
    than silently ignored.

    `seq_len` (kinds in :data:`DEPENDS_ON_SEQ_LEN`) defaults to
    `original_length`, as in HF. It may be a Python int or an integer jax
    scalar (e.g. traced under `jit` in a decoder).

    For "proportional" the second argument is the head dim (see
    :func:`proportional`); `fraction` is its p.

    Returns:
      (inv_freq float32 [rotary_dim // 2], attention_factor): a Python float,
      or a float32 jnp scalar for "dynamic_yarn" with a jax-array seq_len.
    """
    if not isinstance(kind, str) or kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; choose one of: {', '.join(KINDS)}")
    values = dict(
        base=base, factor=factor, original_length=original_length, seq_len=seq_len,
        beta_fast=beta_fast, beta_slow=beta_slow, mscale=mscale, mscale_all_dim=mscale_all_dim,
        truncate=truncate, short_factor=short_factor, long_factor=long_factor,
        low_freq_factor=low_freq_factor, high_freq_factor=high_freq_factor,
        attention_factor=attention_factor, fraction=fraction, temperature=temperature,
    )
    given = {k: v for k, v in values.items() if not _is_default(v, _DEFAULTS[k])}
    try:
        checks.no_extra(f"frequencies({kind!r})", given, allowed=KEYWORDS[kind])
    except ValueError as e:
        if kind == "dynamic_yarn" and "factor" in given:
            raise ValueError(f"{e} (factor is derived there: max(1, seq_len / original_length))") from None
        raise
    return SCALINGS[kind](rotary_dim, **{k: values[k] for k in KEYWORDS[kind]})


_DEFAULTS = {name: p.default for name, p in inspect.signature(frequencies).parameters.items()
             if p.kind is inspect.Parameter.KEYWORD_ONLY}


def _is_default(value, default) -> bool:
    """True when `value` is the default of its keyword (by value, not identity)."""
    if default is None:
        return value is None
    if isinstance(default, bool):
        return isinstance(value, (bool, np.bool_)) and bool(value) == default
    if isinstance(default, str):
        return isinstance(value, str) and value == default
    # Python / NumPy scalars only: an array (a jax scalar, possibly traced) is always "given".
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and value == default
