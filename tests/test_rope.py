"""posenc.rope.apply / rotary_dim: golden vectors, relative-position property
for every frequency kind, layout equivalence, norms, partial rotary, bf16,
exact (range-reduced) and canonical angles, jit / vmap / grad, and errors."""

import functools
import re
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from posenc import phase, rope

X8 = jnp.arange(1.0, 9.0, dtype=jnp.float32).reshape(1, 1, 8)  # [L=1, H=1, Dh=8]
INV8, _ = rope.frequencies("default", 8)


def half_to_interleaved_perm(d):
    """perm such that x_half = x_interleaved[..., perm] (pair i: (2i, 2i+1) -> (i, i + d/2))."""
    return np.concatenate([np.arange(0, d, 2), np.arange(1, d, 2)])


# ---------------------------------------------------------------------------
# Golden vectors (shared/reference/positional.md): x = [1..8], position 3.
# ---------------------------------------------------------------------------


def test_golden_interleaved():
    out = rope.apply(X8, jnp.array([3]), INV8, layout="interleaved")
    expected = [-1.2722325, -1.838865, 1.6839286, 4.7079066, 4.8177772, 6.1472777, 6.9759685, 8.020964]
    np.testing.assert_allclose(out[0, 0], expected, rtol=1e-6, atol=1e-6)


def test_golden_half():
    out = rope.apply(X8, jnp.array([3]), INV8, layout="half")
    expected = [-1.6955925, 0.1375517, 2.7886816, 3.975982, -4.8088425, 6.3230593, 7.0868367, 8.011964]
    np.testing.assert_allclose(out[0, 0], expected, rtol=1e-6, atol=1e-6)
    assert rope.apply(X8, jnp.array([3]), INV8).tolist() == out.tolist()  # "half" is the default


def test_position_zero_is_identity_and_one_is_not():
    for layout in rope.LAYOUTS:
        np.testing.assert_array_equal(rope.apply(X8, jnp.array([0]), INV8, layout=layout), X8)
        assert not np.allclose(rope.apply(X8, jnp.array([1]), INV8, layout=layout), X8)


# ---------------------------------------------------------------------------
# Relative position property for every frequency kind and both layouts.
# ---------------------------------------------------------------------------

KIND_CONFIGS = {
    "default": {},
    "linear": dict(factor=4.0),
    "ntk": dict(factor=4.0),
    "dynamic": dict(factor=4.0, original_length=32, seq_len=100),
    "yarn": dict(factor=8.0, original_length=32),
    "dynamic_yarn": dict(original_length=32, seq_len=200),
    "longrope": dict(factor=4.0, original_length=32, seq_len=100,
                     short_factor=[1.0, 1.5, 2.0, 3.0], long_factor=[1.0, 2.0, 4.0, 8.0]),
    "llama3": dict(factor=8.0, original_length=64),  # pairs in all three bands at d = 8
    "proportional": dict(fraction=0.5),  # two zero frequencies: pairs that are not rotated
}


def test_kind_configs_cover_all_kinds():
    assert set(KIND_CONFIGS) == set(rope.KINDS)


@functools.partial(jax.jit, static_argnames="layout")
def score(q, k, m, n, inv_freq, attention_factor, layout):
    """<RoPE_m q, RoPE_n k> for q, k [Dh] (one token, one head)."""
    qr = rope.apply(q[None, None], m[None], inv_freq, layout=layout, attention_factor=attention_factor)
    kr = rope.apply(k[None, None], n[None], inv_freq, layout=layout, attention_factor=attention_factor)
    return jnp.sum(qr * kr)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("kind", list(KIND_CONFIGS))
@given(m=st.integers(0, 512), n=st.integers(0, 512), shift=st.integers(-512, 1024),
       seed=st.integers(0, 2**16))
def test_scores_depend_only_on_distance(kind, layout, m, n, shift, seed):
    inv, af = rope.frequencies(kind, 8, **KIND_CONFIGS[kind])
    q, k = jax.random.normal(jax.random.key(seed), (2, 10))  # Dh 10: partial rotary (d = 8)
    s0 = score(q, k, jnp.int32(m), jnp.int32(n), inv, af, layout)
    s1 = score(q, k, jnp.int32(m + shift), jnp.int32(n + shift), inv, af, layout)
    # float32 angles p * inv carry ~|p| * 2^-24 rad of rounding (|p| <= 1536 here).
    tol = 5e-4 * float(jnp.linalg.norm(q) * jnp.linalg.norm(k)) * af**2
    assert abs(float(s0) - float(s1)) <= tol
    # and the distance really matters: this is <q, R_{n-m} k>, not <q, k>
    s_rel = score(q, k, jnp.int32(0), jnp.int32(n - m), inv, af, layout)
    assert abs(float(s0) - float(s_rel)) <= tol


# ---------------------------------------------------------------------------
# Layouts, norms, partial rotary, attention factor.
# ---------------------------------------------------------------------------

POS = st.lists(st.integers(0, 4096), min_size=5, max_size=5)


@given(positions=POS, seed=st.integers(0, 2**16))
def test_layouts_agree_up_to_permutation(positions, seed):
    x = jax.random.normal(jax.random.key(seed), (5, 2, 12))
    inv, _ = rope.frequencies("default", 8)  # partial: d = 8 of 12
    perm = np.concatenate([half_to_interleaved_perm(8), np.arange(8, 12)])
    pos = jnp.array(positions)
    via_half = rope.apply(x[..., perm], pos, inv, layout="half")
    via_inter = rope.apply(x, pos, inv, layout="interleaved")[..., perm]
    np.testing.assert_allclose(via_half, via_inter, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@given(positions=POS, seed=st.integers(0, 2**16))
def test_rotation_preserves_norms_and_tail(layout, positions, seed):
    x = jax.random.normal(jax.random.key(seed), (5, 2, 12))
    inv, _ = rope.frequencies("default", 8, base=500.0)
    out = rope.apply(x, jnp.array(positions), inv, layout=layout)
    np.testing.assert_allclose(jnp.linalg.norm(out, axis=-1), jnp.linalg.norm(x, axis=-1), rtol=1e-5)
    # each rotated pair keeps its own norm
    pairs = (lambda a: a[..., :8].reshape(5, 2, 2, 4)) if layout == "half" else (
        lambda a: a[..., :8].reshape(5, 2, 4, 2))
    axis = -2 if layout == "half" else -1
    np.testing.assert_allclose(jnp.linalg.norm(pairs(out), axis=axis),
                               jnp.linalg.norm(pairs(x), axis=axis), rtol=1e-5)
    np.testing.assert_array_equal(out[..., 8:], x[..., 8:])  # partial rotary: tail untouched


def test_attention_factor_scales_rotated_dims_only():
    x = jax.random.normal(jax.random.key(0), (4, 1, 10))
    pos = jnp.arange(4)
    inv, af = rope.frequencies("yarn", 8, factor=16.0, original_length=32)
    assert af == pytest.approx(0.1 * np.log(16.0) + 1)
    plain = rope.apply(x, pos, inv)
    scaled = rope.apply(x, pos, inv, attention_factor=af)
    np.testing.assert_allclose(scaled[..., :8], af * plain[..., :8], rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(scaled[..., 8:], x[..., 8:])


def test_rotary_dim():
    assert rope.rotary_dim(64) == 64
    assert rope.rotary_dim(64, 0.25) == 16
    assert rope.rotary_dim(80, 0.5) == 40
    assert rope.rotary_dim(100, 0.29) == 28  # int() truncates 28.999..., as in HF


@pytest.mark.parametrize("args, match", [
    ((10, 0.5), "rotary dim int(10 * 0.5) = 5 must be even and positive"),
    ((4, 0.1), "rotary dim int(4 * 0.1) = 0 must be even and positive"),
    ((64, 0.0), "fraction must be in (0, 1]; got 0.0"),
    ((64, 1.5), "fraction must be in (0, 1]; got 1.5"),
    ((64, -0.5), "fraction must be in (0, 1]; got -0.5"),
    ((0, 1.0), "head_dim must be a positive integer; got 0"),
])
def test_rotary_dim_errors(args, match):
    with pytest.raises(ValueError, match=re.escape(match)):
        rope.rotary_dim(*args)


# ---------------------------------------------------------------------------
# Precision: bf16 activations, large positions.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@given(positions=st.lists(st.integers(0, 100_000), min_size=5, max_size=5), seed=st.integers(0, 2**16))
def test_bf16_equals_float32_then_cast(layout, positions, seed):
    x = jax.random.normal(jax.random.key(seed), (2, 5, 2, 10)).astype(jnp.bfloat16)
    pos = jnp.array(positions)
    inv, _ = rope.frequencies("default", 8)
    out = rope.apply(x, pos, inv, layout=layout)
    assert out.dtype == jnp.bfloat16 and out.shape == x.shape
    expected = rope.apply(x.astype(jnp.float32), pos, inv, layout=layout).astype(jnp.bfloat16)
    np.testing.assert_array_equal(out.astype(jnp.float32), expected.astype(jnp.float32))


def test_large_positions_use_float32_angles():
    # Consecutive positions near 1e5 (not representable in bf16) against a NumPy
    # reference with the same float32 angles p * inv and float64 sin / cos.
    x = jax.random.normal(jax.random.key(1), (4, 1, 8))
    pos = np.array([99_997, 99_998, 99_999, 100_000], dtype=np.int32)
    inv, _ = rope.frequencies("default", 8)
    out = np.asarray(rope.apply(x, jnp.asarray(pos), inv, layout="interleaved", angles="canonical"))
    theta = (pos.astype(np.float32)[:, None] * np.asarray(inv)).astype(np.float64)[:, None, :]
    xe, xo = np.asarray(x, np.float64)[..., 0::2], np.asarray(x, np.float64)[..., 1::2]
    ref = np.stack([xe * np.cos(theta) - xo * np.sin(theta),
                    xo * np.cos(theta) + xe * np.sin(theta)], axis=-1).reshape(x.shape)
    np.testing.assert_allclose(out, ref, atol=1e-5)
    assert len({out[i].tobytes() for i in range(4)}) == 4


# ---------------------------------------------------------------------------
# Exact (range-reduced) angles against an exact rational reference.
# ---------------------------------------------------------------------------

# pi to 60 digits (an independent source from the Machin series in posenc.phase).
PI = Fraction("3.14159265358979323846264338327950288419716939937510582097494459")


def exact_angle(p, f):
    """(p * f) mod 2 pi in [-pi, pi] with p an int and f the float32 value, in exact rationals."""
    t = Fraction(int(p)) * Fraction(float(f)) / (2 * PI)
    return float((t - round(t)) * 2 * PI)


def angle_error(a, b):
    return np.abs(np.angle(np.exp(1j * (np.asarray(a, np.float64) - b))))


EDGE_POSITIONS = [0, 1, -1, 3, 4095, 4096, 4097, 2**24 - 1, 2**24, -(2**24), 65_536, 99_999, 10**6,
                  2**31 - 1, -(2**31)]


def test_exact_angles_within_bound_for_every_int32_position():
    inv, _ = rope.frequencies("default", 64)
    freqs = np.concatenate([np.asarray(inv), np.float32([0.0, 1.0, 3.0, -0.37, 123.456, 2**20, 7.3e-9, 1e-30])])
    rng = np.random.default_rng(0)
    pos = np.concatenate([EDGE_POSITIONS, rng.integers(-(2**31), 2**31, 24), rng.integers(0, 2 * 10**6, 24)])
    want = np.array([[exact_angle(p, f) for f in freqs] for p in pos])
    for fn in (rope.angles, jax.jit(rope.angles, static_argnames="method")):
        got = np.asarray(fn(jnp.asarray(pos, jnp.int32), freqs, method="exact"))
        assert got.dtype == np.float32 and np.abs(got).max() <= np.float32(np.pi)
        assert angle_error(got, want).max() <= phase.MAX_ERROR
    # The float32 product is what drifts: near 1e6 rad it is off by up to 2^-5.
    canonical = np.asarray(rope.angles(jnp.asarray(pos, jnp.int32), freqs[:32]))
    big = np.abs(pos[:, None] * freqs[None, :32].astype(np.float64)) > 1e5
    assert angle_error(canonical, want[:, :32])[big].max() > 1e-3


def test_exact_and_canonical_agree_at_small_positions_and_canonical_is_the_product():
    inv, _ = rope.frequencies("default", 16)
    pos = jnp.arange(-300, 300)
    canonical = np.asarray(rope.angles(pos, inv), np.float64)
    # they differ by the rounding of the float32 product, <= |p inv| 2^-24, and the exact bound
    tol = np.abs(canonical) * 2.0**-24 + phase.MAX_ERROR
    assert (angle_error(rope.angles(pos, inv, method="exact"), canonical) <= tol).all()
    x = jax.random.normal(jax.random.key(7), (600, 2, 16))
    # canonical: HF's float32 p * inv_freq, cos / sin, x cos + rotate_half(x) sin, bitwise.
    theta = pos.astype(jnp.float32)[:, None] * inv
    cos, sin = jnp.cos(theta)[:, None], jnp.sin(theta)[:, None]
    hf = x * jnp.concatenate([cos, cos], -1) + jnp.concatenate([-x[..., 8:], x[..., :8]], -1) * jnp.concatenate(
        [sin, sin], -1)
    np.testing.assert_array_equal(rope.apply(x, pos, inv, angles="canonical"), hf)
    np.testing.assert_array_equal(rope.apply(x, pos, inv), rope.apply(x, pos, inv, angles="exact"))


@functools.partial(jax.jit, static_argnames="angles")
def unit_score(q, k, m, n, inv_freq, angles):
    q, k = q / jnp.linalg.norm(q), k / jnp.linalg.norm(k)
    qr = rope.apply(q[None, None], m[None], inv_freq, angles=angles)
    kr = rope.apply(k[None, None], n[None], inv_freq, angles=angles)
    return jnp.sum(qr * kr)


@given(m=st.integers(0, 4096), n=st.integers(0, 4096), shift=st.sampled_from([10**6, -(10**6), 2**30, 65_536]),
       seed=st.integers(0, 2**16))
def test_exact_logits_are_shift_invariant_to_1e6_and_beyond(m, n, shift, seed):
    inv, _ = rope.frequencies("default", 32)
    q, k = jax.random.normal(jax.random.key(seed), (2, 32))
    s0 = unit_score(q, k, jnp.int32(m), jnp.int32(n), inv, "exact")
    s1 = unit_score(q, k, jnp.int32(m + shift), jnp.int32(n + shift), inv, "exact")
    assert abs(float(s0) - float(s1)) <= 1e-4
    # ... and equal the float64 value <q, R_{n-m} k> of unit vectors.
    qn, kn = (np.asarray(v, np.float64) / np.linalg.norm(np.asarray(v, np.float64)) for v in (q, k))
    t = (n - m) * np.asarray(inv, np.float64)
    want = np.sum(qn[:16] * (kn[:16] * np.cos(t) - kn[16:] * np.sin(t))
                  + qn[16:] * (kn[16:] * np.cos(t) + kn[:16] * np.sin(t)))
    assert abs(float(s1) - want) <= 1e-5


def test_canonical_logits_drift_at_1e6():
    # What "exact" fixes: the canonical float32 angles drift with the offset.
    inv, _ = rope.frequencies("default", 32)
    q, k = jax.random.normal(jax.random.key(0), (2, 32))
    drift = [abs(float(unit_score(q, k, jnp.int32(m), jnp.int32(m + 7), inv, "canonical"))
                 - float(unit_score(q, k, jnp.int32(m + 10**6), jnp.int32(m + 7 + 10**6), inv, "canonical")))
             for m in range(0, 200, 10)]
    assert max(drift) > 1e-4  # the bound the exact angles meet (3.6e-4 here, unit q and k)


def test_exact_angles_zero_frequencies_traced_and_grad():
    # p-RoPE zeros: those pairs pass through unchanged at any position.
    inv, _ = rope.frequencies("proportional", 16, fraction=0.5)
    assert (np.asarray(inv) == 0).sum() == 4
    x = jax.random.normal(jax.random.key(1), (3, 1, 16))
    pos = jnp.array([5, 10**6, 2**31 - 1])
    out = jax.jit(rope.apply)(x, pos, inv)  # traced positions and inv_freq
    zero = np.concatenate([np.asarray(inv) == 0] * 2)
    np.testing.assert_array_equal(np.asarray(out)[..., zero], np.asarray(x)[..., zero])
    np.testing.assert_allclose(out, rope.apply(x, pos, inv), rtol=0, atol=1e-6)  # fused: ulps may differ
    # d/d inv_freq of sum sin(angles) = sum_p p cos(p inv), as for the plain product.
    inv8, _ = rope.frequencies("default", 8)
    p = jnp.array([3, 1000, 10**6])
    g = jax.grad(lambda f: jnp.sum(jnp.sin(rope.angles(p, f, method="exact"))))(inv8)
    pf = np.asarray(p, np.float64)[:, None]
    want = (pf * np.cos(pf * np.asarray(inv8, np.float64))).sum(0)
    np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_bf16_rotation_error_bound_at_100k(layout):
    # Stated bound: every output element is within 2^-8 |exact element| + 1e-6 |pair| of the
    # exact rotation of the bf16 input (the float32 rotation rounded to bf16 once).
    x = jax.random.normal(jax.random.key(4), (2, 64, 2, 16)).astype(jnp.bfloat16)
    rng = np.random.default_rng(1)
    pos = rng.integers(99_000, 100_001, size=(2, 64)).astype(np.int32)
    inv, _ = rope.frequencies("default", 16)
    xs = np.asarray(x.astype(jnp.float32), np.float64)
    t = pos[..., None, None].astype(np.float64) * np.asarray(inv, np.float64)  # exact below 2^53
    a, b = (xs[..., :8], xs[..., 8:]) if layout == "half" else (xs[..., 0::2], xs[..., 1::2])
    ra, rb = a * np.cos(t) - b * np.sin(t), b * np.cos(t) + a * np.sin(t)
    pair = np.sqrt(a**2 + b**2)

    def excess(angles):
        out = np.asarray(rope.apply(x, jnp.asarray(pos), inv, layout=layout, angles=angles).astype(jnp.float32))
        oa, ob = (out[..., :8], out[..., 8:]) if layout == "half" else (out[..., 0::2], out[..., 1::2])
        return max((np.abs(o - r) - (2.0**-8 * np.abs(r) + 1e-6 * pair)).max() for o, r in ((oa, ra), (ob, rb)))

    assert excess("exact") <= 0
    assert excess("canonical") > 0  # its angle error alone, up to 2^-8 rad at 1e5, breaks the bound


# ---------------------------------------------------------------------------
# jit, vmap, grad with leading batch dims.
# ---------------------------------------------------------------------------

XB = jax.random.normal(jax.random.key(2), (2, 5, 3, 10))  # [B, L, H, Dh]
POS_BL = jnp.array([[0, 1, 2, 3, 4], [7, 9, 11, 13, 15]])
POS_L = jnp.arange(5)


@pytest.mark.parametrize("positions", [POS_BL, POS_L], ids=["[B,L]", "[L]"])
def test_jit_matches_eager_and_broadcasts(positions):
    inv, _ = rope.frequencies("default", 8)
    eager = rope.apply(XB, positions, inv, layout="interleaved")
    jitted = jax.jit(functools.partial(rope.apply, layout="interleaved"))(XB, positions, inv)
    np.testing.assert_allclose(jitted, eager, rtol=1e-6, atol=1e-6)
    for b in range(2):  # each batch row uses its own (or the shared) positions
        row = positions[b] if positions.ndim == 2 else positions
        np.testing.assert_allclose(eager[b], rope.apply(XB[b], row, inv, layout="interleaved"),
                                   rtol=1e-6, atol=1e-6)


def test_vmap_over_batch():
    inv, _ = rope.frequencies("default", 8)
    mapped = jax.vmap(lambda x, p: rope.apply(x, p, inv))(XB, POS_BL)
    np.testing.assert_allclose(mapped, rope.apply(XB, POS_BL, inv), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("positions", [POS_BL, POS_L], ids=["[B,L]", "[L]"])
def test_grad_is_inverse_rotation(positions):
    # apply is linear and orthogonal in x: d/dx <c, R_p x> = R_p^T c = R_{-p} c.
    inv, _ = rope.frequencies("default", 8)
    c = jax.random.normal(jax.random.key(3), XB.shape)
    grad = jax.jit(jax.grad(lambda x: jnp.sum(c * rope.apply(x, positions, inv))))(XB)
    np.testing.assert_allclose(grad, rope.apply(c, -positions, inv), rtol=1e-5, atol=1e-5)
    grad_sq = jax.grad(lambda x: 0.5 * jnp.sum(rope.apply(x, positions, inv) ** 2))(XB)
    np.testing.assert_allclose(grad_sq, XB, rtol=1e-5, atol=1e-5)


def test_jit_with_traced_seq_len_frequencies():
    @jax.jit
    def f(x, positions, n):
        inv, af = rope.frequencies("dynamic_yarn", 8, original_length=4, seq_len=n)
        return rope.apply(x, positions, inv, attention_factor=af)

    inv, af = rope.frequencies("dynamic_yarn", 8, original_length=4, seq_len=5)
    np.testing.assert_allclose(f(XB, POS_BL, jnp.int32(5)),
                               rope.apply(XB, POS_BL, inv, attention_factor=af), rtol=2e-5, atol=2e-5)


# ---------------------------------------------------------------------------
# Errors name the bad value and the allowed ones.
# ---------------------------------------------------------------------------


def apply_raises(match, x=XB, positions=POS_BL, inv=INV8, **kw):
    with pytest.raises(ValueError, match=re.escape(match)):
        rope.apply(x, positions, inv, **kw)


def test_unknown_layout_and_angles():
    apply_raises("unknown layout 'neox'; choose one of: half, interleaved", layout="neox")
    apply_raises("unknown angles 'fast'; choose one of: canonical, exact", angles="fast")
    with pytest.raises(ValueError, match=re.escape("unknown angles 'hf'; choose one of: canonical, exact")):
        rope.angles(POS_L, INV8, method="hf")


def test_inv_freq_longer_than_half_head_dim():
    apply_raises("rotary dim 2 * 6 = 12 must be in [2, head dim 10] "
                 "(inv_freq may have at most head_dim // 2 = 5 entries)", inv=jnp.ones(6))


@pytest.mark.parametrize("inv", [jnp.ones(0), jnp.ones((2, 2))])
def test_bad_inv_freq_shape(inv):
    apply_raises(f"inv_freq must be a non-empty 1-D array [rotary_dim // 2]; got shape {inv.shape}",
                 inv=inv)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.bool_])
def test_positions_must_be_integers(dtype):
    apply_raises(f"positions must be an integer array (never float or bf16); got dtype {jnp.dtype(dtype)}",
                 positions=POS_BL.astype(dtype))


def test_positions_must_broadcast_to_x():
    msg = "does not broadcast to the leading dims of x (2, 5, 3)"
    apply_raises(msg, positions=jnp.zeros((3, 5), jnp.int32))
    apply_raises(msg, positions=jnp.zeros((4,), jnp.int32))


def test_x_must_be_float_and_attention_factor_positive():
    apply_raises("x must be a floating-point array; got dtype int32", x=jnp.ones((5, 1, 8), jnp.int32),
                 positions=POS_L)
    apply_raises("attention_factor must be positive; got 0.0", attention_factor=0.0)
