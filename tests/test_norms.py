"""Tests for posenc.norms: reference constants, golden values, invariances, dtypes, errors."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from posenc import norm_names, norms

D = 8


def _x(seed, shape=(2, 3, D), loc=0.0, scale=1.0):
    return np.random.default_rng(seed).normal(loc, scale, shape).astype(np.float32)


def _vec(seed, lo=0.5, hi=1.5):
    return np.random.default_rng(seed).uniform(lo, hi, (D,)).astype(np.float32)


# ---------------------------------------------------------------- references


def test_deepnorm_constants_reference_values():
    a6, b6 = norms.deepnorm_constants(6)
    a12, b12 = norms.deepnorm_constants(12)
    assert round(a6, 4) == 1.8612 and round(b6, 4) == 0.3799
    assert round(a12, 4) == 2.2134 and round(b12, 4) == 0.3195


@pytest.mark.parametrize("bad", [0, -3, 2.0, True, "12"])
def test_deepnorm_constants_rejects_bad_num_layers(bad):
    with pytest.raises(ValueError, match="num_layers"):
        norms.deepnorm_constants(bad)


def test_softcap_reference_value_and_bound():
    assert float(norms.softcap(jnp.float32(100.0), 50.0)) == pytest.approx(48.2014, abs=1e-4)
    big = norms.softcap(jnp.array([-1e6, 0.0, 1e6]), 30.0)
    np.testing.assert_allclose(big, [-30.0, 0.0, 30.0], atol=1e-5)
    # small inputs pass through: cap * tanh(x / cap) ~ x
    np.testing.assert_allclose(norms.softcap(jnp.float32(0.01), 50.0), 0.01, rtol=1e-6)


def test_softcap_bf16_in_bf16_out_from_float32_math():
    x = jnp.asarray([100.0, -37.5, 3.0], jnp.bfloat16)
    y = norms.softcap(x, 50.0)
    assert y.dtype == jnp.bfloat16
    ref = (50.0 * np.tanh(np.asarray(x, np.float64) / 50.0)).astype(jnp.bfloat16)
    np.testing.assert_array_equal(np.asarray(y, np.float32), np.asarray(ref, np.float32))


@pytest.mark.parametrize("cap", [0.0, -1.0, float("nan"), None])
def test_softcap_rejects_bad_cap(cap):
    with pytest.raises(ValueError, match="cap"):
        norms.softcap(jnp.ones(3), cap)


# ------------------------------------------------- golden values (float64 numpy)


def _np_layer(x, g, b, eps):
    x = x.astype(np.float64)
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    y = (x - mu) / np.sqrt(var + eps) * g
    return y if b is None else y + b


def _np_rms(x, g, eps):
    x = x.astype(np.float64)
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + eps) * g


def test_layer_norm_golden():
    x, g, b = _x(0, loc=3.0, scale=2.0), _vec(1), _vec(2, -1.0, 1.0)
    np.testing.assert_allclose(norms.layer_norm(x, g, b), _np_layer(x, g, b, 1e-6), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        norms.layer_norm(x, g, eps=1e-2), _np_layer(x, g, None, 1e-2), rtol=1e-5, atol=1e-5
    )


def test_rms_norm_golden_and_unit_offset():
    x, g = _x(3), _vec(4, -0.5, 0.5)
    np.testing.assert_allclose(norms.rms_norm(x, g), _np_rms(x, g, 1e-6), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        norms.rms_norm(x, g, unit_offset=True), _np_rms(x, 1.0 + g.astype(np.float64), 1e-6),
        rtol=1e-5, atol=1e-6,
    )


def test_rms_unit_offset_zero_equals_gain_one():
    x = _x(5)
    np.testing.assert_array_equal(
        norms.rms_norm(x, jnp.zeros(D), unit_offset=True), norms.rms_norm(x, jnp.ones(D))
    )


def test_scale_norm_golden():
    x = _x(6)
    x64 = x.astype(np.float64)
    ref = 2.5 * x64 / np.maximum(np.linalg.norm(x64, axis=-1, keepdims=True), 1e-5)
    np.testing.assert_allclose(norms.scale_norm(x, jnp.float32(2.5)), ref, rtol=1e-5, atol=1e-6)
    # below eps the denominator is eps, not the norm
    tiny = np.full((D,), 1e-7, np.float32)
    np.testing.assert_allclose(norms.scale_norm(tiny, 1.0), tiny / 1e-5, rtol=1e-5)


def test_l2_normalize_golden():
    x = _x(7)
    ref = x / np.linalg.norm(x.astype(np.float64), axis=-1, keepdims=True)
    y = norms.l2_normalize(x)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(np.asarray(y), axis=-1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(norms.l2_normalize(jnp.zeros((2, D))), 0.0)


def test_dyt_golden():
    x, g, b = _x(8, scale=3.0), _vec(9), _vec(10, -1.0, 1.0)
    ref = g * np.tanh(0.7 * x.astype(np.float64)) + b
    np.testing.assert_allclose(norms.dyt(x, jnp.float32(0.7), g, b), ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(norms.dyt(x, 0.7, g), ref - b, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ invariances


@given(seed=st.integers(0, 2**16), s=st.floats(0.5, 20.0), c=st.floats(-50.0, 50.0))
def test_layer_norm_invariant_to_shift_and_positive_scale(seed, s, c):
    x, g, b = _x(seed), _vec(seed + 1), _vec(seed + 2)
    # atol 1e-4: float32 rounding of s * x + c (|c| <= 50, ulp ~4e-6) is
    # amplified by 1 / std after centering; eps 1e-10 keeps the eps term
    # (which breaks exact scale invariance) below that.
    np.testing.assert_allclose(
        norms.layer_norm(s * x + c, g, b, eps=1e-10), norms.layer_norm(x, g, b, eps=1e-10),
        rtol=1e-4, atol=1e-4,
    )


@given(seed=st.integers(0, 2**16), s=st.floats(0.05, 50.0))
def test_rms_and_scale_norm_invariant_to_positive_scale(seed, s):
    x, g = _x(seed), _vec(seed + 1)
    np.testing.assert_allclose(
        norms.rms_norm(s * x, g, eps=1e-10), norms.rms_norm(x, g, eps=1e-10), rtol=1e-5, atol=1e-5
    )
    np.testing.assert_allclose(
        norms.scale_norm(s * x, 3.0), norms.scale_norm(x, 3.0), rtol=1e-5, atol=1e-5
    )


def test_layer_norm_is_not_scale_invariant_when_eps_dominates():
    # guards the invariance test: with a huge eps the property must fail
    x = _x(11)
    a = norms.layer_norm(x, jnp.ones(D), eps=10.0)
    b = norms.layer_norm(10 * x, jnp.ones(D), eps=10.0)
    assert np.max(np.abs(np.asarray(a) - np.asarray(b))) > 0.1


# ------------------------------------------------------------------- dtypes


def _naive_bf16_layer_norm(x):
    bf = jnp.bfloat16
    mean = jnp.mean(x).astype(bf)
    c = (x - mean).astype(bf)
    var = jnp.mean((c * c).astype(bf)).astype(bf)
    return (c * jax.lax.rsqrt(var + bf(1e-6))).astype(bf)


def test_bf16_in_bf16_out_with_float32_statistics():
    # Large mean: values near 1000 are spaced 4 apart in bf16, so the mean
    # 1002 of alternating 1000, 1004 rounds to 1000 or 1004 in bf16 and the
    # naive centering becomes (0, 4) instead of (-2, 2).
    x = jnp.asarray(1000.0 + 4.0 * (np.arange(D) % 2), jnp.bfloat16)
    ones = jnp.ones(D)
    ref = norms.layer_norm(x.astype(jnp.float32), ones)  # float32 all the way
    for fn in (
        lambda v: norms.layer_norm(v, ones),
        lambda v: norms.rms_norm(v, ones),
        lambda v: norms.scale_norm(v, 2.0),
        lambda v: norms.dyt(v, 0.5, ones),
        lambda v: norms.l2_normalize(v),
    ):
        y = fn(x)
        assert y.dtype == jnp.bfloat16
        np.testing.assert_array_equal(
            np.asarray(y, np.float32),
            np.asarray(fn(x.astype(jnp.float32)).astype(jnp.bfloat16), np.float32),
        )
    ours = np.asarray(norms.layer_norm(x, ones), np.float32)
    np.testing.assert_allclose(ours, ref, rtol=1e-2, atol=1e-2)  # bf16 output rounding only
    naive = np.asarray(_naive_bf16_layer_norm(x), np.float32)
    np.testing.assert_allclose(ref, np.tile([-1.0, 1.0], D // 2), atol=1e-5)
    assert np.max(np.abs(naive - np.asarray(ref))) > 0.5


def test_gain_applied_in_float32_before_cast():
    # Gemma order: (normed * (1 + w)).astype(bf16), one rounding only.
    x = jnp.asarray(_x(12), jnp.bfloat16)
    w = jnp.asarray(_vec(13, -0.3, 0.3))
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32**2, -1, keepdims=True) + 1e-6)
    expected = (normed * (1.0 + w)).astype(jnp.bfloat16)
    np.testing.assert_array_equal(
        np.asarray(norms.rms_norm(x, w, unit_offset=True), np.float32), np.asarray(expected, np.float32)
    )


# -------------------------------------------------------------- dispatch


def test_dispatch_matches_functions():
    x = _x(14)
    expected = {
        "layer": _np_layer(x, 1.0, 0.0, 1e-6),
        "layer_nobias": _np_layer(x, 1.0, None, 1e-6),
        "rms": _np_rms(x, 1.0, 1e-6),
        "rms_offset": _np_rms(x, 1.0, 1e-6),
        # ScaleNorm at init, sqrt(D) * x / ||x||, has unit RMS like RMSNorm
        "scale": _np_rms(x, 1.0, 0.0),
        "dyt": np.tanh(0.5 * x.astype(np.float64)),
        "derf": np.vectorize(math.erf)(0.5 * x.astype(np.float64)),  # Dynamic_erf at init
        "none": x,
    }
    for kind, ref in expected.items():
        out = norms.normalize(kind, x, norms.init_params(kind, D))
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5, err_msg=kind)
    # eps is passed through
    np.testing.assert_allclose(
        norms.normalize("rms", x, norms.init_params("rms", D), eps=0.5),
        _np_rms(x, 1.0, 0.5), rtol=1e-5, atol=1e-6,
    )
    assert set(expected) == set(norms.NORMS)  # every dispatchable kind was checked above


@pytest.mark.parametrize("kind", ["dyt", "none"])
def test_a_keyword_the_norm_does_not_use_is_refused(kind):
    x = _x(15)
    with pytest.raises(ValueError, match=f"norm kind {kind!r} does not use eps; it takes: no keywords"):
        norms.normalize(kind, x, norms.init_params(kind, D), eps=1e-5)
    with pytest.raises(ValueError, match="init_params of norm kind 'rms' does not use dyt_alpha"):
        norms.init_params("rms", D, dyt_alpha=0.3)
    np.testing.assert_allclose(norms.init_params("dyt", D, dyt_alpha=0.3)["alpha"], 0.3)


def test_init_params_shapes_and_values():
    assert norms.init_params("none", D) == {}
    p = norms.init_params("dyt", D, dyt_alpha=0.8)
    assert float(p["alpha"]) == pytest.approx(0.8) and p["alpha"].shape == ()
    np.testing.assert_array_equal(p["gamma"], np.ones(D))
    np.testing.assert_array_equal(p["beta"], np.zeros(D))
    assert float(norms.init_params("scale", 64)["gain"]) == 8.0
    np.testing.assert_array_equal(norms.init_params("rms_offset", D)["scale"], np.zeros(D))
    lp = norms.init_params("layer", D)
    assert lp["scale"].dtype == jnp.float32 and lp["bias"].shape == (D,)


@pytest.mark.parametrize("kind", sorted(norm_names.NORM_KINDS))
def test_gradients_finite_at_zero_input(kind):
    params = norms.init_params(kind, D)
    w = jnp.asarray(_vec(15, -1.0, 1.0))

    def loss(x, p):
        return jnp.sum(norms.normalize(kind, x, p) * w)

    gx, gp = jax.grad(loss, argnums=(0, 1))(jnp.zeros((2, D)), params)
    assert np.all(np.isfinite(np.asarray(gx)))
    for leaf in jax.tree_util.tree_leaves(gp):
        assert np.all(np.isfinite(np.asarray(leaf)))


def test_l2_normalize_gradient_finite_at_zero():
    g = jax.grad(lambda x: jnp.sum(norms.l2_normalize(x)))(jnp.zeros(D))
    assert np.all(np.isfinite(np.asarray(g)))


@pytest.mark.parametrize("kind", ["layer", "rms_offset", "scale", "dyt"])
def test_jit_vmap_grad_with_leading_batch_dims(kind):
    params = norms.init_params(kind, D)
    x = jnp.asarray(_x(16, shape=(2, 3, 4, D)))
    eager = norms.normalize(kind, x, params)
    jitted = jax.jit(lambda v, p: norms.normalize(kind, v, p))(x, params)
    np.testing.assert_allclose(jitted, eager, rtol=1e-6, atol=1e-6)
    vmapped = jax.vmap(lambda v: norms.normalize(kind, v, params))(x)
    np.testing.assert_allclose(vmapped, eager, rtol=1e-6, atol=1e-6)
    # per-row normalisation: the gradient of row 0's output ignores row 1
    g = jax.grad(lambda v: jnp.sum(norms.normalize(kind, v, params)[0] ** 3))(x)
    assert np.all(np.asarray(g[1]) == 0.0) and np.any(np.asarray(g[0]) != 0.0)


# ------------------------------------------------------------------- errors


@pytest.mark.parametrize("eps", [0.0, -1e-6, float("nan"), float("inf"), "small"])
def test_bad_eps_raises_naming_eps(eps):
    with pytest.raises(ValueError, match="eps"):
        norms.layer_norm(jnp.ones(D), jnp.ones(D), eps=eps)
    with pytest.raises(ValueError, match="eps"):
        norms.rms_norm(jnp.ones(D), jnp.ones(D), eps=eps)
    with pytest.raises(ValueError, match="eps"):
        norms.scale_norm(jnp.ones(D), 1.0, eps=eps)
    with pytest.raises(ValueError, match="eps"):
        norms.l2_normalize(jnp.ones(D), eps=eps)
    with pytest.raises(ValueError, match="eps"):
        norms.normalize("rms", jnp.ones(D), {"scale": jnp.ones(D)}, eps=eps)


def test_shape_mismatch_names_both_shapes():
    x = jnp.ones((2, D))
    with pytest.raises(ValueError, match=r"scale shape \(4,\).*\(2, 8\)"):
        norms.layer_norm(x, jnp.ones(4))
    with pytest.raises(ValueError, match=r"bias shape \(3,\).*\(2, 8\)"):
        norms.layer_norm(x, jnp.ones(D), jnp.zeros(3))
    with pytest.raises(ValueError, match=r"scale shape \(2, 8\).*\(2, 8\)"):
        norms.rms_norm(x, jnp.ones((2, D)))
    with pytest.raises(ValueError, match=r"gamma shape \(7,\)"):
        norms.dyt(x, 0.5, jnp.ones(7))
    with pytest.raises(ValueError, match=r"gain must be a scalar"):
        norms.scale_norm(x, jnp.ones(D))
    with pytest.raises(ValueError, match=r"alpha must be a scalar"):
        norms.dyt(x, jnp.ones(D), jnp.ones(D))


def test_unknown_kind_lists_all_kinds():
    for call in (
        lambda: norms.normalize("rsm", jnp.ones(D), {}),
        lambda: norms.init_params("rsm", D),
    ):
        with pytest.raises(ValueError, match="unknown norm kind 'rsm'") as e:
            call()
        for kind in norm_names.NORM_KINDS:
            assert kind in str(e.value)


def test_wrong_param_keys_and_bad_dim():
    with pytest.raises(ValueError, match=r"expects params with keys \(bias, scale\); got \(scale\)"):
        norms.normalize("layer", jnp.ones(D), {"scale": jnp.ones(D)})
    with pytest.raises(ValueError, match="dim"):
        norms.init_params("rms", 0)


def test_traced_eps_is_accepted():
    # eps is normally static; a traced one must not trip the concrete check
    y = jax.jit(lambda e: norms.rms_norm(jnp.ones(D), jnp.ones(D), eps=e))(1e-6)
    np.testing.assert_allclose(y, np.ones(D), rtol=1e-5)
    assert math.isfinite(float(y[0]))
