"""posenc.rope.frequencies: golden vectors, parity with a float64 transcription
of HuggingFace transformers' modeling_rope_utils, jit with a traced seq_len,
and every validation error."""

import inspect
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from posenc import rope, rope_scaling

# ---------------------------------------------------------------------------
# Independent NumPy float64 reference, transcribed from the HF formulas
# (_compute_{default,linear_scaling,dynamic_ntk,yarn,longrope,llama3}_parameters).
# Two deliberate float32 steps, where HF's float32 tensors lose more than a
# few ulps and float64 would then disagree with HF itself:
# - the exponent arange(0, d, 2) / d: ln(base) (up to ~14) amplifies its
#   rounding to ~1e-6 relative in base**exponent;
# - the YaRN ramp: HF mixes with weight 1 - ramp, which cancels near ramp = 1.
# What remains is a few float32 ulps, hence rtol 1e-6.
# ---------------------------------------------------------------------------


def ref_exponent(d):
    return (np.arange(0, d, 2, dtype=np.float32) / np.float32(d)).astype(np.float64)


def ref_default(d, base):
    return 1.0 / base ** ref_exponent(d)


def ref_mscale(s, k=1.0):
    return 1.0 if s <= 1 else 0.1 * k * math.log(s) + 1.0


def ref_yarn(d, base, s, L, beta_fast=32.0, beta_slow=1.0, truncate=True,
             mscale=None, mscale_all_dim=None, attention_factor=None):
    def corr(r):
        return d * math.log(L / (r * 2 * math.pi)) / (2 * math.log(base))

    low, high = corr(beta_fast), corr(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001
    f32 = np.float32
    ramp = np.clip((np.arange(d // 2, dtype=f32) - f32(low)) / f32(high - low), 0, 1)
    ramp = (f32(1) - (f32(1) - ramp)).astype(np.float64)  # HF's weight 1 - (1 - ramp)
    inv = ref_default(d, base)
    out = (inv / s) * ramp + inv * (1 - ramp)
    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = ref_mscale(s, mscale) / ref_mscale(s, mscale_all_dim)
        else:
            attention_factor = ref_mscale(s)
    return out, attention_factor


def ref_dynamic(d, base, s, L, n):
    n = max(n, L)
    new_base = base * ((s * n / L) - (s - 1)) ** (d / (d - 2))
    return ref_default(d, new_base), 1.0


def ref_longrope(d, base, s, L, n, short, long, attention_factor=None):
    lam = np.asarray(long if n > L else short, dtype=np.float32).astype(np.float64)
    if attention_factor is None:
        attention_factor = 1.0 if s <= 1 else math.sqrt(1 + math.log(s) / math.log(L))
    return 1.0 / (lam * base ** ref_exponent(d)), attention_factor


def ref_llama3(d, base, s, L, a=1.0, b=4.0):
    inv = ref_default(d, base)
    wl = 2 * math.pi / inv
    t = (L / wl - a) / (b - a)
    out = np.where(wl > L / a, inv / s, np.where(wl < L / b, inv, (1 - t) * inv / s + t * inv))
    return out, 1.0


def freqs(*args, **kwargs):
    inv, af = rope.frequencies(*args, **kwargs)
    assert isinstance(inv, jax.Array) and inv.dtype == jnp.float32
    return np.asarray(inv), af


def check(kind, ref, rtol=1e-6, **kw):
    inv, af = freqs(kind, **kw)
    ref_inv, ref_af = ref
    assert inv.dtype == jnp.float32 and inv.shape == (kw["rotary_dim"] // 2,)
    np.testing.assert_allclose(np.asarray(inv), ref_inv, rtol=rtol, atol=0)
    assert isinstance(af, float)
    assert af == pytest.approx(ref_af, rel=1e-12)


# ---------------------------------------------------------------------------
# Golden vectors (shared/reference/positional.md): head dim 128, base 1e4.
# ---------------------------------------------------------------------------


def test_golden_default():
    inv, af = freqs("default", 128)
    np.testing.assert_allclose(inv[[0, 1, 16, 63]], [1.0, 0.86596, 0.1, 1.1548e-04], rtol=5e-5)
    assert af == 1.0


def test_golden_dynamic():
    inv, af = freqs("dynamic", 128, factor=10, original_length=2048, seq_len=16384)
    base = 10000.0 * ((10 * 16384 / 2048) - 9) ** (128 / 126)
    assert base == pytest.approx(759702.23, rel=1e-8)
    np.testing.assert_allclose(inv[[1, 63]], [0.80931, 1.6265e-06], rtol=5e-5)
    assert af == 1.0


def test_golden_yarn():
    inv, af = freqs("yarn", 128, factor=10, original_length=2048)
    default, _ = freqs("default", 128)
    np.testing.assert_array_equal(inv[:17], default[:17])  # low = 16: ramp is 0 up to pair 16
    np.testing.assert_allclose(inv[[17, 40]], [8.3479e-02, 4.3007e-04], rtol=5e-5)
    np.testing.assert_allclose(inv[41:], default[41:] / 10, rtol=2e-7)
    assert af == pytest.approx(1.2302585, rel=1e-7)


def test_golden_yarn_untruncated():
    inv, af = freqs(
        "yarn", 64, base=150000.0, factor=32, original_length=4096, truncate=False
    )
    np.testing.assert_allclose(inv[[8, 17]], [5.081328e-02, 1.293187e-04], rtol=1e-6)
    assert af == pytest.approx(1.3465736, rel=1e-7)
    # The correction range itself: 8.0928 / 17.3980.
    corr = lambda r: 64 * math.log(4096 / (r * 2 * math.pi)) / (2 * math.log(150000.0))  # noqa: E731
    assert (corr(32), corr(1)) == (pytest.approx(8.0928, abs=1e-4), pytest.approx(17.3980, abs=1e-4))


def test_golden_llama3():
    inv, af = freqs("llama3", 128, factor=10, original_length=2048)
    default, _ = freqs("default", 128)
    np.testing.assert_array_equal(inv[:31], default[:31])
    np.testing.assert_allclose(inv[[31, 40]], [1.0730e-02, 3.4539e-04], rtol=5e-5)
    np.testing.assert_allclose(inv[41:], default[41:] / 10, rtol=2e-7)
    assert af == 1.0


def test_golden_longrope_attention_factor():
    half = 32
    _, af = freqs(
        "longrope", 64, factor=32, original_length=4096, seq_len=100,
        short_factor=[1.0] * half, long_factor=[4.0] * half,
    )
    assert af == pytest.approx(1.190238, rel=1e-6)


def test_linear_is_position_interpolation():
    # inv / s at position p is the default rotation at position p / s.
    inv, _ = freqs("linear", 64, factor=4.0)
    default, _ = freqs("default", 64)
    np.testing.assert_allclose(inv * 12, default * 3, rtol=1e-6)


# ---------------------------------------------------------------------------
# Parity with the float64 reference over sampled configurations.
# ---------------------------------------------------------------------------

DIMS = st.sampled_from([8, 16, 32, 64, 96, 128])
BASES = st.floats(100.0, 1e6)
FACTORS = st.floats(1.0, 64.0)
LENGTHS = st.integers(16, 32768)


@given(d=DIMS, base=BASES, s=FACTORS)
def test_parity_default_linear_ntk(d, base, s):
    check("default", (ref_default(d, base), 1.0), rotary_dim=d, base=base)
    check("linear", (ref_default(d, base) / s, 1.0), rotary_dim=d, base=base, factor=s)
    ntk_base = base * s ** (d / (d - 2))
    check("ntk", (ref_default(d, ntk_base), 1.0), rotary_dim=d, base=base, factor=s)


@given(d=DIMS, base=BASES, s=FACTORS, L=LENGTHS, n_over_L=st.floats(0.0, 8.0))
def test_parity_dynamic(d, base, s, L, n_over_L):
    n = max(1, int(n_over_L * L))  # covers n <= L (default freqs) and n > L
    check("dynamic", ref_dynamic(d, base, s, L, n),
          rotary_dim=d, base=base, factor=s, original_length=L, seq_len=n)
    if n <= L:
        check("dynamic", (ref_default(d, base), 1.0),
              rotary_dim=d, base=base, factor=s, original_length=L, seq_len=n)


@given(
    d=DIMS, base=BASES, s=st.one_of(st.just(1.0), FACTORS), L=LENGTHS,
    beta_fast=st.floats(4.0, 64.0), beta_slow=st.floats(0.25, 4.0), truncate=st.booleans(),
    mscales=st.sampled_from([(None, None), (1.0, None), (None, 1.0), (0.707, 0.707),
                             (1.0, 0.707), (0.0, 1.0), (1.2, 0.8)]),
    attention_factor=st.one_of(st.none(), st.floats(0.5, 2.0)),
)
def test_parity_yarn(d, base, s, L, beta_fast, beta_slow, truncate, mscales, attention_factor):
    mscale, mscale_all_dim = mscales
    kw = dict(beta_fast=beta_fast, beta_slow=beta_slow, truncate=truncate,
              mscale=mscale, mscale_all_dim=mscale_all_dim, attention_factor=attention_factor)
    check("yarn", ref_yarn(d, base, s, L, **kw),
          rotary_dim=d, base=base, factor=s, original_length=L, **kw)


def test_yarn_equal_correction_bounds():
    # low == high after the clamps: HF widens the ramp by 0.001 instead of dividing by 0.
    # With L tiny both corrections are negative, so low = max(floor, 0) = 0 and
    # high = min(ceil(<= 0), d - 1) = 0.
    check("yarn", ref_yarn(16, 10000.0, 4.0, 3, beta_fast=32.0, beta_slow=1.0),
          rotary_dim=16, factor=4.0, original_length=3)
    inv, _ = freqs("yarn", 16, factor=4.0, original_length=3)
    default, _ = freqs("default", 16)
    np.testing.assert_allclose(inv[1:], default[1:] / 4, rtol=1e-6)  # ramp 1 from pair 1 on


@given(d=DIMS, base=BASES, L=LENGTHS, n_over_L=st.floats(0.0, 8.0), truncate=st.booleans(),
       mscales=st.sampled_from([(None, None), (1.0, 0.707), (0.707, 0.707)]))
def test_parity_dynamic_yarn(d, base, L, n_over_L, truncate, mscales):
    n = max(1, int(n_over_L * L))
    s = max(1.0, n / L)
    mscale, mscale_all_dim = mscales
    kw = dict(truncate=truncate, mscale=mscale, mscale_all_dim=mscale_all_dim)
    check("dynamic_yarn", ref_yarn(d, base, s, L, **kw),
          rotary_dim=d, base=base, original_length=L, seq_len=n, **kw)


@given(d=DIMS, base=BASES, s=st.one_of(st.just(1.0), FACTORS), L=LENGTHS,
       n_over_L=st.floats(0.0, 4.0), data=st.data(),
       attention_factor=st.one_of(st.none(), st.floats(0.5, 2.0)))
def test_parity_longrope(d, base, s, L, n_over_L, data, attention_factor):
    n = max(1, int(n_over_L * L))
    lam = st.lists(st.floats(1.0, 64.0), min_size=d // 2, max_size=d // 2)
    short, long = data.draw(lam), data.draw(lam)
    check("longrope", ref_longrope(d, base, s, L, n, short, long, attention_factor),
          rotary_dim=d, base=base, factor=s, original_length=L, seq_len=n,
          short_factor=short, long_factor=long, attention_factor=attention_factor)


def test_longrope_switches_at_original_length():
    kw = dict(original_length=64, short_factor=[1.0, 2.0], long_factor=[3.0, 5.0])
    default, _ = freqs("default", 4)
    at, _ = freqs("longrope", 4, seq_len=64, **kw)
    past, _ = freqs("longrope", 4, seq_len=65, **kw)
    np.testing.assert_allclose(at, default / np.array([1.0, 2.0]), rtol=1e-6)
    np.testing.assert_allclose(past, default / np.array([3.0, 5.0]), rtol=1e-6)


@given(d=DIMS, base=BASES, s=FACTORS, L=LENGTHS,
       ab=st.tuples(st.floats(0.25, 4.0), st.floats(0.25, 8.0)))
def test_parity_llama3(d, base, s, L, ab):
    a, b = ab[0], ab[0] + ab[1]
    inv, af = freqs("llama3", d, base=base, factor=s, original_length=L,
                    low_freq_factor=a, high_freq_factor=b)
    ref, _ = ref_llama3(d, base, s, L, a, b)
    assert af == 1.0
    # In the smooth band the Llama 3 formula is ill-conditioned in inv_i:
    # t = (L / w - a) / (b - a) cancels, so a one-ulp difference in the float32
    # default frequency (any two powf implementations) is amplified by
    # kappa = 1 + (L / w) / (b - a) * (1 - 1/s) / ((1 - t)/s + t), up to ~40 here.
    # Outside the band kappa = 1 and the bound is the plain rtol 1e-6.
    wl = 2 * math.pi / ref_default(d, base)
    t = (L / wl - a) / (b - a)
    medium = (wl >= L / b) & (wl <= L / a)
    kappa = np.where(medium, 1 + (L / wl) / (b - a) * (1 - 1 / s) / ((1 - t) / s + t), 1.0)
    np.testing.assert_array_less(np.abs(inv / ref - 1), 1e-6 * kappa)


@pytest.mark.parametrize("kind", ["linear", "ntk", "yarn", "llama3"])
def test_factor_one_gives_default(kind):
    default, _ = freqs("default", 32)
    kw = dict(original_length=512) if kind in rope_scaling.NEEDS_ORIGINAL_LENGTH else {}
    inv, af = freqs(kind, 32, factor=1.0, **kw)
    np.testing.assert_allclose(inv, default, rtol=1e-6)
    assert af == 1.0


# ---------------------------------------------------------------------------
# Traced seq_len (a decoder calls frequencies under jit).
# ---------------------------------------------------------------------------


def test_traced_seq_len_matches_concrete():
    common = dict(original_length=256, base=10000.0)
    lam = dict(short_factor=[1.0, 1.5, 2.0, 3.0], long_factor=[2.0, 4.0, 8.0, 16.0])
    cases = [
        ("dynamic", dict(factor=4.0, **common)),
        ("dynamic_yarn", dict(mscale=1.0, mscale_all_dim=0.707, **common)),
        ("longrope", dict(factor=8.0, **lam, **common)),
    ]
    for kind, kw in cases:
        fn = jax.jit(lambda n, kind=kind, kw=kw: rope.frequencies(kind, 8, seq_len=n, **kw))
        for n in (100, 256, 257, 2000):
            inv_t, af_t = fn(jnp.int32(n))
            inv_c, af_c = freqs(kind, 8, seq_len=n, **kw)
            # Traced scalars are float32 where the concrete path uses Python
            # float64 (the NTK base, the YaRN factor): ~1e-7 relative apart.
            np.testing.assert_allclose(inv_t, inv_c, rtol=2e-6, err_msg=f"{kind} n={n}")
            np.testing.assert_allclose(af_t, af_c, rtol=1e-6, err_msg=f"{kind} n={n}")


def test_dynamic_yarn_attention_factor_types():
    kw = dict(original_length=16)
    _, af = freqs("dynamic_yarn", 8, seq_len=64, **kw)
    assert isinstance(af, float) and af == pytest.approx(0.1 * math.log(4) + 1)
    _, af = freqs("dynamic_yarn", 8, seq_len=jnp.int32(64), **kw)
    assert isinstance(af, jax.Array) and af.shape == () and af.dtype == jnp.float32
    _, af = freqs("dynamic_yarn", 8, seq_len=jnp.int32(64), attention_factor=1.5, **kw)
    assert af == 1.5 and isinstance(af, float)


# ---------------------------------------------------------------------------
# Validation errors name the bad value and the allowed ones.
# ---------------------------------------------------------------------------


def raises(match, *args, **kwargs):
    with pytest.raises(ValueError, match=re.escape(match)):
        rope.frequencies(*args, **kwargs)


def test_unknown_kind_lists_all_kinds():
    assert rope.KINDS == ("default", "linear", "ntk", "dynamic", "yarn", "dynamic_yarn",
                          "longrope", "llama3", "proportional")
    raises("unknown kind 'rop'; choose one of: " + ", ".join(rope.KINDS), "rop", 8)


@pytest.mark.parametrize("d", [7, 0, -4, 8.0, True])
def test_bad_rotary_dim(d):
    raises(f"rotary_dim must be a positive even integer; got {d!r}", "default", d)


@pytest.mark.parametrize("kind", ["ntk", "dynamic"])
def test_ntk_needs_rotary_dim_at_least_4(kind):
    kw = dict(original_length=16, seq_len=32) if kind == "dynamic" else {}
    raises(f"rotary_dim must be an even integer >= 4 for kind {kind!r}; got 2", kind, 2,
           factor=2.0, **kw)


# Every keyword with a non-default value, for kinds that take it.
FULL = dict(original_length=16, seq_len=8, short_factor=[1.0] * 4, long_factor=[1.0] * 4)


def own(kind, **kw):
    """The entries of `kw` that `kind` takes (the strict API refuses the others)."""
    return {k: v for k, v in kw.items() if k in rope_scaling.KEYWORDS[kind]}


@pytest.mark.parametrize("kind", ["linear", "ntk", "dynamic", "yarn", "llama3", "longrope"])
def test_factor_below_one(kind):
    raises("factor must be a number >= 1; got 0.5", kind, 8, factor=0.5, **own(kind, **FULL))


@pytest.mark.parametrize("kind", ["dynamic", "yarn", "dynamic_yarn", "longrope", "llama3"])
def test_missing_original_length(kind):
    kw = own(kind, **FULL)
    del kw["original_length"]
    raises(f"kind {kind!r} needs original_length", kind, 8, **kw)
    assert kind in rope_scaling.NEEDS_ORIGINAL_LENGTH


@pytest.mark.parametrize("kind", ["dynamic", "dynamic_yarn", "longrope"])
def test_missing_seq_len_means_the_original_length(kind):
    # As in HF: no seq_len (initialisation) behaves like seq_len = original_length.
    kw = own(kind, original_length=16, short_factor=[1.0, 2.0, 3.0, 4.0],
             long_factor=[5.0, 6.0, 7.0, 8.0], factor=4.0 if kind == "dynamic" else 1.0)
    missing = rope.frequencies(kind, 8, **kw)
    at_original = rope.frequencies(kind, 8, seq_len=16, **kw)
    longer = rope.frequencies(kind, 8, seq_len=64, **kw)
    np.testing.assert_array_equal(np.asarray(missing[0]), np.asarray(at_original[0]))
    assert float(missing[1]) == float(at_original[1])
    assert not np.allclose(np.asarray(missing[0]), np.asarray(longer[0]))


@pytest.mark.parametrize("seq_len", [0, 3.5, -1])
def test_bad_seq_len(seq_len):
    raises(f"seq_len must be a positive integer; got {seq_len!r}", "dynamic", 8,
           original_length=16, seq_len=seq_len)


def test_float_traced_seq_len_rejected():
    raises("seq_len must be an integer scalar", "dynamic", 8, original_length=16,
           seq_len=jnp.float32(3.0))


@pytest.mark.parametrize("which", ["short_factor", "long_factor"])
def test_longrope_factor_length(which):
    kw = dict(short_factor=[1.0] * 4, long_factor=[1.0] * 4)
    kw[which] = [1.0] * 3
    raises(f"{which} must have rotary_dim // 2 = 4 entries; got shape (3,) (3 entries)",
           "longrope", 8, original_length=16, seq_len=8, **kw)
    kw[which] = None
    raises(f"kind 'longrope' needs {which}", "longrope", 8, original_length=16, seq_len=8, **kw)


def test_llama3_low_not_below_high():
    raises("low_freq_factor must be < high_freq_factor; got low_freq_factor=4.0, high_freq_factor=4.0",
           "llama3", 8, factor=8.0, original_length=16, low_freq_factor=4.0, high_freq_factor=4.0)
    raises("low_freq_factor=5.0, high_freq_factor=1.0", "llama3", 8, factor=8.0,
           original_length=16, low_freq_factor=5.0, high_freq_factor=1.0)


@pytest.mark.parametrize("base", [0.0, -10000.0])
def test_bad_base(base):
    raises(f"base must be a positive number; got {base!r}", "default", 8, base=base)


def test_yarn_betas():
    raises("beta_fast must be >= beta_slow; got beta_fast=1.0, beta_slow=32.0", "yarn", 8,
           factor=2.0, original_length=16, beta_fast=1.0, beta_slow=32.0)
    raises("beta_slow must be a positive number; got 0.0", "yarn", 8, factor=2.0,
           original_length=16, beta_slow=0.0)


def test_attention_factor_only_where_used():
    raises("frequencies('linear') does not use attention_factor; it takes: base, factor",
           "linear", 8, factor=2.0, attention_factor=2.0)
    raises("attention_factor must be a positive number; got -1.0", "yarn", 8, factor=2.0,
           original_length=16, attention_factor=-1.0)


def test_factor_rejected_where_unused():
    raises("frequencies('default') does not use factor; it takes: base", "default", 8, factor=4.0)
    raises("frequencies('dynamic_yarn') does not use factor; it takes: base, original_length, "
           "seq_len, beta_fast", "dynamic_yarn", 8, factor=4.0, original_length=16, seq_len=32)
    raises("(factor is derived there: max(1, seq_len / original_length))", "dynamic_yarn", 8,
           factor=4.0, original_length=16)


# ---------------------------------------------------------------------------
# Strict API: each kind takes exactly its keywords; the tables the model
# layer derives its validation from.
# ---------------------------------------------------------------------------

EXPECTED_KEYWORDS = {
    "default": ("base",),
    "linear": ("base", "factor"),
    "ntk": ("base", "factor"),
    "dynamic": ("base", "factor", "original_length", "seq_len"),
    "yarn": ("base", "factor", "original_length", "beta_fast", "beta_slow", "mscale",
             "mscale_all_dim", "truncate", "attention_factor", "temperature"),
    "dynamic_yarn": ("base", "original_length", "seq_len", "beta_fast", "beta_slow", "mscale",
                     "mscale_all_dim", "truncate", "attention_factor", "temperature"),
    "longrope": ("base", "factor", "original_length", "seq_len", "short_factor", "long_factor",
                 "attention_factor"),
    "llama3": ("base", "factor", "original_length", "low_freq_factor", "high_freq_factor"),
    "proportional": ("base", "factor", "fraction"),
}

# A valid non-default value for every keyword of `frequencies` (d = 8).
NON_DEFAULT = dict(base=500.0, factor=2.0, original_length=64, seq_len=100, beta_fast=16.0,
                   beta_slow=2.0, mscale=1.0, mscale_all_dim=0.5, truncate=False,
                   short_factor=[1.0, 1.0, 1.5, 2.0], long_factor=[1.0, 2.0, 3.0, 4.0],
                   low_freq_factor=2.0, high_freq_factor=8.0, attention_factor=1.5,
                   fraction=0.5, temperature="quadratic")


def base_kw(kind):
    """NON_DEFAULT for `kind`, less temperature (it excludes attention_factor and mscale)."""
    return own(kind, **{k: v for k, v in NON_DEFAULT.items() if k != "temperature"})


def test_keyword_tables():
    assert {k: rope_scaling.KEYWORDS[k] for k in EXPECTED_KEYWORDS} == EXPECTED_KEYWORDS
    assert set(rope_scaling.KEYWORDS) == set(rope.KINDS) == set(rope_scaling.SCALINGS)
    assert rope_scaling.NEEDS_ORIGINAL_LENGTH == ("dynamic", "yarn", "dynamic_yarn", "longrope",
                                                  "llama3")
    assert rope_scaling.DEPENDS_ON_SEQ_LEN == ("dynamic", "dynamic_yarn", "longrope")
    # every keyword of `frequencies` belongs to some kind, and NON_DEFAULT covers them all
    params = inspect.signature(rope.frequencies).parameters
    keywords = [n for n, p in params.items() if p.kind is p.KEYWORD_ONLY]
    assert set(keywords) == set().union(*rope_scaling.KEYWORDS.values()) == set(NON_DEFAULT)


@pytest.mark.parametrize("kind", rope.KINDS)
def test_kind_functions_share_the_defaults_of_frequencies(kind):
    fn = rope_scaling.SCALINGS[kind]
    params = inspect.signature(rope.frequencies).parameters
    for name, p in inspect.signature(fn).parameters.items():
        if p.kind is p.KEYWORD_ONLY:
            assert p.default == params[name].default, (kind, name)


@pytest.mark.parametrize("kind", rope.KINDS)
def test_frequencies_dispatches_with_the_kinds_keywords(kind):
    kw = base_kw(kind)
    inv, af = rope.frequencies(kind, 8, **kw)
    inv_direct, af_direct = rope_scaling.SCALINGS[kind](8, **kw)
    np.testing.assert_array_equal(np.asarray(inv), np.asarray(inv_direct))
    assert af == af_direct


# Non-default values that each change the result (d = 64, base 500, L = 64).
EFFECT = dict(base=500.0, factor=2.0, original_length=64, seq_len=100, beta_fast=2.0,
              beta_slow=0.5, mscale=1.0, mscale_all_dim=0.5, truncate=False,
              short_factor=np.linspace(1.0, 2.0, 32), long_factor=np.linspace(1.0, 4.0, 32),
              low_freq_factor=2.0, high_freq_factor=8.0, attention_factor=1.5, fraction=0.5,
              temperature="quadratic")


@pytest.mark.parametrize("kind", rope.KINDS)
def test_every_keyword_a_kind_takes_is_used(kind):
    for name in rope_scaling.KEYWORDS[kind]:
        # attention_factor overrides the computed one and temperature="quadratic"
        # excludes it and the mscale pair: leave them out unless tested
        kw = own(kind, **{k: v for k, v in EFFECT.items()
                          if k not in ("attention_factor", "temperature")})
        if name in ("attention_factor", "temperature"):
            kw[name] = EFFECT[name]
        if name == "temperature":
            del kw["mscale"], kw["mscale_all_dim"]
        inv, af = rope.frequencies(kind, 64, **kw)
        del kw[name]
        try:
            inv2, af2 = rope.frequencies(kind, 64, **kw)
        except ValueError:
            assert name in ("original_length", "short_factor", "long_factor")  # required
            continue
        assert not (np.array_equal(np.asarray(inv2), np.asarray(inv)) and af2 == af), (kind, name)


@pytest.mark.parametrize("kind", rope.KINDS)
def test_unused_keywords_are_refused_with_the_kinds_keywords(kind):
    takes = rope_scaling.KEYWORDS[kind]
    kw = base_kw(kind)
    for name, value in NON_DEFAULT.items():
        if name in takes:
            continue
        raises(f"frequencies({kind!r}) does not use {name}; it takes: {', '.join(takes)}",
               kind, 8, **kw, **{name: value})
    # The same keywords at their defaults are accepted and change nothing.
    params = inspect.signature(rope.frequencies).parameters
    defaults = {n: params[n].default for n in NON_DEFAULT if n not in takes}
    with_defaults = rope.frequencies(kind, 8, **kw, **defaults)
    plain = rope.frequencies(kind, 8, **kw)
    np.testing.assert_array_equal(np.asarray(with_defaults[0]), np.asarray(plain[0]))
    assert with_defaults[1] == plain[1]


def test_defaults_are_told_apart_by_value():
    # 32 == 32.0, False != True, [] is not None: by value, not by identity.
    rope.frequencies("linear", 8, factor=2.0, beta_fast=32, truncate=True, mscale=None)
    rope.frequencies("linear", 8, factor=2.0, truncate=np.bool_(True))
    raises("does not use truncate", "linear", 8, truncate=False)
    raises("does not use short_factor", "linear", 8, short_factor=[])
    raises("does not use beta_fast", "linear", 8, beta_fast=jnp.float32(32.0))


def test_kind_functions_take_exactly_their_keywords():
    with pytest.raises(TypeError):
        rope_scaling.linear(8, factor=2.0, original_length=16)
    inv, af = rope_scaling.yarn(8, factor=4.0, original_length=32)
    np.testing.assert_array_equal(np.asarray(inv), np.asarray(
        rope.frequencies("yarn", 8, factor=4.0, original_length=32)[0]))


def test_length_dependence_is_continuous_or_a_switch():
    """dynamic / dynamic_yarn keep changing past L; longrope switches once, at L + 1."""
    for kind in rope_scaling.DEPENDS_ON_SEQ_LEN:
        kw = base_kw(kind)
        at = {n: np.asarray(rope.frequencies(kind, 8, **{**kw, "seq_len": n})[0])
              for n in (1, 64, 65, 256)}
        np.testing.assert_array_equal(at[1], at[64])  # up to L: the initial frequencies
        assert not np.array_equal(at[64], at[65])
        assert np.array_equal(at[65], at[256]) == (kind == "longrope")
    for kind in set(rope.KINDS) - set(rope_scaling.DEPENDS_ON_SEQ_LEN):
        assert "seq_len" not in rope_scaling.KEYWORDS[kind]


# ---------------------------------------------------------------------------
# p-RoPE / HF "proportional", and how it differs from the NeoX rotary fraction.
# ---------------------------------------------------------------------------


def ref_proportional(head_dim, base, factor, rope_proportion):
    """huggingface/transformers src/transformers/modeling_rope_utils.py,
    _compute_proportional_rope_parameters, transcribed (NumPy for torch; the
    float32 exponent kept, the power in float64 as ref_default above)."""
    rope_angles = int(rope_proportion * head_dim // 2)
    exponent = np.arange(0, 2 * rope_angles, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    inv_freq_rotated = 1.0 / (base ** exponent.astype(np.float64))
    nope_angles = head_dim // 2 - rope_angles
    if nope_angles > 0:
        inv_freq = np.concatenate((inv_freq_rotated, np.zeros(nope_angles)), axis=0)
    else:
        inv_freq = inv_freq_rotated
    inv_freq /= np.float32(factor)
    return inv_freq, 1.0


@given(head_dim=st.sampled_from([2, 4, 6, 8, 10, 16, 48, 64, 128, 256, 512]),
       p=st.one_of(st.sampled_from([0.0, 0.25, 0.3, 0.5, 0.75, 1.0]), st.floats(0.0, 1.0)),
       base=BASES, s=st.one_of(st.just(1.0), FACTORS))
def test_parity_proportional(head_dim, p, base, s):
    check("proportional", ref_proportional(head_dim, base, s, p),
          rotary_dim=head_dim, base=base, factor=s, fraction=p)


def test_proportional_golden_and_the_neox_rotary_fraction_differ():
    prop, af = freqs("proportional", 8, fraction=0.5)
    np.testing.assert_allclose(prop, [1.0, 0.1, 0.0, 0.0], rtol=1e-6)
    assert af == 1.0
    # GPT-NeoX rotary_pct: recompute over the rotary width int(0.5 * 8) = 4.
    neox, _ = freqs("default", rope.rotary_dim(8, 0.5))
    np.testing.assert_allclose(neox, [1.0, 0.01], rtol=1e-6)
    # Gemma-4-like shape: head_dim 256, p = 0.25 -> 32 of 128 pairs rotate.
    prop, _ = freqs("proportional", 256, fraction=0.25, base=1e6)
    default, _ = freqs("default", 256, base=1e6)
    assert prop.shape == (128,) and np.count_nonzero(prop) == 32
    np.testing.assert_array_equal(prop[:32], default[:32])
    neox, _ = freqs("default", 64, base=1e6)
    assert not np.allclose(neox, prop[:32])  # same count, other frequencies
    # int(p * head_dim // 2) is (p * head_dim) // 2, as in HF
    assert np.count_nonzero(freqs("proportional", 10, fraction=0.3)[0]) == 1
    assert np.count_nonzero(freqs("proportional", 6, fraction=0.25)[0]) == 0


def test_proportional_rotates_pairs_across_the_whole_head():
    """The silent mixes (NeoX pairs with p-RoPE frequencies, p-RoPE pairs with
    NeoX frequencies) all give other outputs; p-RoPE leaves dims 2, 3, 6, 7."""
    x = jax.random.normal(jax.random.key(0), (3, 2, 8))
    pos = jnp.array([0, 5, 37])
    prop, _ = rope.frequencies("proportional", 8, fraction=0.5)
    out = np.asarray(rope.apply(x, pos, prop))
    np.testing.assert_array_equal(out[..., [2, 3, 6, 7]], np.asarray(x)[..., [2, 3, 6, 7]])
    # pair (0, 4) turns by p * 1, pair (1, 5) by p * 0.1 (half layout over the head)
    for i, inv in ((0, 1.0), (1, 0.1)):
        c, s = np.cos(np.asarray(pos) * inv)[:, None], np.sin(np.asarray(pos) * inv)[:, None]
        a, b = np.asarray(x)[..., i], np.asarray(x)[..., i + 4]
        np.testing.assert_allclose(out[..., i], a * c - b * s, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(out[..., i + 4], b * c + a * s, rtol=1e-5, atol=1e-5)
    neox_freqs, _ = rope.frequencies("default", 4)
    mixes = {
        "neox": rope.apply(x, pos, neox_freqs),  # rotary_pct: pairs (i, i + 2), 1/base^(2i/4)
        "p-freqs, neox pairs": rope.apply(x, pos, prop[:2]),  # no zero padding
        "neox freqs, p pairs": rope.apply(x, pos, jnp.concatenate([neox_freqs, jnp.zeros(2)])),
    }
    for name, other in mixes.items():
        assert not np.allclose(np.asarray(other), out, atol=1e-3), name


def test_proportional_limits():
    for d in (8, 64):
        default, _ = freqs("default", d)
        np.testing.assert_array_equal(freqs("proportional", d, fraction=1.0)[0], default)
        linear, _ = freqs("linear", d, factor=4.0)
        np.testing.assert_array_equal(freqs("proportional", d, fraction=1.0, factor=4.0)[0], linear)
        none, _ = freqs("proportional", d, fraction=0.0)
        np.testing.assert_array_equal(none, np.zeros(d // 2))
    x = jax.random.normal(jax.random.key(1), (4, 1, 8))
    np.testing.assert_array_equal(rope.apply(x, jnp.arange(4), jnp.asarray(freqs(
        "proportional", 8, fraction=0.0)[0])), x)  # p = 0 is NoPE


@pytest.mark.parametrize("p", [-0.1, 1.5, "half", True])
def test_proportional_bad_fraction(p):
    raises(f"fraction must be a finite number >= 0.0 <= 1.0; got {p!r}", "proportional", 8,
           fraction=p)


def test_proportional_first_argument_is_the_head_dim():
    raises("head_dim must be a positive even integer; got 7", "proportional", 7, fraction=0.5)
    assert freqs("proportional", 12, fraction=0.5)[0].shape == (6,)


def test_proportional_refuses_other_keywords():
    raises("frequencies('proportional') does not use original_length; it takes: base, factor, "
           "fraction", "proportional", 8, original_length=16)
    raises("frequencies('default') does not use fraction; it takes: base", "default", 8,
           fraction=0.5)


# ---------------------------------------------------------------------------
# YaRN attention temperature: "paper" (HF) and "quadratic".
# ---------------------------------------------------------------------------

# Logit multiplier a^2 at s = 2, 4, 8, 16 (the table in rope_scaling.yarn's docstring).
PAPER_LOGIT = [1.1434, 1.2965, 1.4591, 1.6314]
QUADRATIC_LOGIT = [1.1029, 1.2732, 1.5106, 1.8154]


def test_yarn_temperature_table():
    for s, paper, quad in zip((2, 4, 8, 16), PAPER_LOGIT, QUADRATIC_LOGIT):
        inv_p, a_p = freqs("yarn", 32, factor=s, original_length=64)
        inv_q, a_q = freqs("yarn", 32, factor=s, original_length=64, temperature="quadratic")
        assert a_p == pytest.approx(0.1 * math.log(s) + 1, rel=1e-12)  # sqrt(1/t) = 0.1 ln s + 1
        assert a_q == pytest.approx(math.sqrt(1 + 0.1 * math.log(s) + 0.07 * math.log(s) ** 2),
                                    rel=1e-12)
        assert a_p**2 == pytest.approx(paper, abs=5e-5)
        assert a_q**2 == pytest.approx(quad, abs=5e-5)
        np.testing.assert_array_equal(inv_p, inv_q)  # only the attention factor changes
    assert freqs("yarn", 32, factor=1.0, original_length=64, temperature="quadratic")[1] == 1.0


def test_dynamic_yarn_quadratic_temperature_traced():
    kw = dict(original_length=16, temperature="quadratic")
    fn = jax.jit(lambda n: rope.frequencies("dynamic_yarn", 8, seq_len=n, **kw))
    for n in (8, 16, 64, 1000):
        s = max(1.0, n / 16)
        want = math.sqrt(1 + 0.1 * math.log(s) + 0.07 * math.log(s) ** 2)
        assert freqs("dynamic_yarn", 8, seq_len=n, **kw)[1] == pytest.approx(want, rel=1e-12)
        assert float(fn(jnp.int32(n))[1]) == pytest.approx(want, rel=1e-6)


def test_yarn_temperature_errors():
    raises("unknown temperature 'cubic'; choose one of: paper, quadratic", "yarn", 8, factor=2.0,
           original_length=16, temperature="cubic")
    raises("temperature='quadratic' computes the attention factor itself; it cannot be combined "
           "with attention_factor=1.2", "yarn", 8, factor=2.0, original_length=16,
           temperature="quadratic", attention_factor=1.2)
    raises("or with mscale=1.0 and mscale_all_dim=0.5", "dynamic_yarn", 8, original_length=16,
           temperature="quadratic", mscale=1.0, mscale_all_dim=0.5)
    # mscale alone is ignored by the HF rule, so it does not conflict
    _, af = freqs("yarn", 8, factor=4.0, original_length=16, temperature="quadratic", mscale=1.0)
    assert af == pytest.approx(math.sqrt(1 + 0.1 * math.log(4) + 0.07 * math.log(4) ** 2))
    raises("frequencies('llama3') does not use temperature", "llama3", 8, factor=2.0,
           original_length=16, temperature="quadratic")


def test_a_traced_factor_is_refused_as_not_static():
    """Frequencies set the program's constants: a factor traced under jit says so in one line."""
    import jax

    from posenc import rope

    f = jax.jit(lambda factor: rope.frequencies("yarn", 16, factor=factor, original_length=32)[0])
    with pytest.raises(ValueError, match=r"^factor must be a static Python number, known when the program "
                                         r"is traced; got a traced value \(.*Tracer\): pass it outside "
                                         r"jax.jit, or as a static argument"):
        f(4.0)
    g = jax.jit(lambda base: rope.frequencies("default", 16, base=base)[0])
    with pytest.raises(ValueError, match=r"^base must be a static Python number"):
        g(10000.0)
