import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc import fire, kerple

QP = jnp.array([[3, 4, 5], [7, 8, 9]])
KP = jnp.array([[0, 1, 2, 3, 4, 5], [4, 5, 6, 7, 8, 9]])


def np_dist(qp, kp):
    return np.asarray(qp)[..., :, None] - np.asarray(kp)[..., None, :]


# ----------------------------------------------------------------- KERPLE


def test_kerple_log_and_power_formulas():
    a, p = jnp.array([0.5, 2.0]), jnp.array([1.5, 0.7])
    d = np.abs(np_dist(QP, KP)).astype(np.float64)[:, None]
    log = kerple.bias(QP, KP, a, p, kind="log")
    assert log.shape == (2, 2, 3, 6) and log.dtype == jnp.float32
    want_log = -np.array([1.5, 0.7])[:, None, None] * np.log1p(np.array([0.5, 2.0])[:, None, None] * d)
    np.testing.assert_allclose(log, want_log, rtol=1e-5, atol=1e-6)
    power = kerple.bias(QP, KP, a, p, kind="power")
    want_pow = -np.array([0.5, 2.0])[:, None, None] * d ** np.array([1.5, 0.7])[:, None, None]
    np.testing.assert_allclose(power, want_pow, rtol=1e-5, atol=1e-6)


def test_kerple_clamps_parameters():
    d = np.abs(np_dist(QP[0], KP[0])).astype(np.float64)
    out = kerple.bias(QP[0], KP[0], jnp.array([-1.0, 0.001]), jnp.array([0.0, -5.0]), kind="log")
    np.testing.assert_allclose(out, np.broadcast_to(-0.01 * np.log1p(0.01 * d), (2, 3, 6)), rtol=1e-5)
    out = kerple.bias(QP[0], KP[0], jnp.array([1.0]), jnp.array([3.5]), kind="power")
    np.testing.assert_allclose(out[0], -(d**2.0), rtol=1e-5)  # p clamped to 2
    out = kerple.bias(QP[0], KP[0], jnp.array([0.0]), jnp.array([0.0]), kind="power")
    np.testing.assert_allclose(out[0], -0.01 * d**0.01, rtol=1e-5)


def test_kerple_grads_finite_at_zero_distance_and_straight_through():
    q = k = jnp.arange(4)  # includes |i - j| = 0
    for kind in kerple.KINDS:
        ga, gp = jax.grad(lambda a, p: kerple.bias(q, k, a, p, kind=kind).sum(), (0, 1))(jnp.ones(2), jnp.ones(2))
        assert np.isfinite(np.asarray(ga)).all() and np.isfinite(np.asarray(gp)).all()
        assert (np.asarray(ga) != 0).all() and (np.asarray(gp) != 0).all()
    # Below the clamp the gradient still flows (the reference code clamps the data, not the graph).
    g = jax.grad(lambda a: kerple.bias(q, k, a, jnp.ones(1)).sum())(jnp.array([-3.0]))
    assert float(g[0]) < 0
    # d/dp of -a d^p at p = 1: -a d log d, summed over pairs (0 at d = 0 and d = 1).
    gp = jax.grad(lambda p: kerple.bias(q, k, jnp.ones(1), p, kind="power").sum())(jnp.ones(1))
    d = np.abs(np_dist(q, k)).astype(np.float64)
    np.testing.assert_allclose(gp[0], -(d[d > 0] * np.log(d[d > 0])).sum(), rtol=1e-5)


@settings(max_examples=25, deadline=None)
@given(shift=st.integers(-1000, 1000), kind=st.sampled_from(kerple.KINDS))
def test_kerple_depends_only_on_distance(shift, kind):
    a, p = jnp.array([0.3, 1.2]), jnp.array([0.9, 1.7])
    np.testing.assert_allclose(
        kerple.bias(QP + shift, KP + shift, a, p, kind=kind), kerple.bias(QP, KP, a, p, kind=kind), atol=1e-6
    )


def test_kerple_jit_vmap():
    a, p = jnp.array([0.3, 1.2]), jnp.array([0.9, 1.7])
    out = jax.jit(kerple.bias, static_argnames="kind")(QP, KP, a, p, kind="power")
    np.testing.assert_allclose(jax.vmap(lambda q, k: kerple.bias(q, k, a, p, kind="power"))(QP, KP), out)
    np.testing.assert_allclose(out[0], out[1])


def test_kerple_errors():
    with pytest.raises(ValueError, match="unknown kind 'exp'; choose one of: log, power"):
        kerple.bias(QP, KP, jnp.ones(2), jnp.ones(2), kind="exp")
    with pytest.raises(ValueError, match=r"a and p must both have shape \[H\]"):
        kerple.bias(QP, KP, jnp.ones(2), jnp.ones(3))
    with pytest.raises(ValueError, match="integer array"):
        kerple.bias(QP * 1.0, KP, jnp.ones(2), jnp.ones(2))


# ------------------------------------------------------------------- FIRE


def naive_fire(qp, kp, params, eps=1e-6):
    """Loop over (i, j) pairs, following the paper's formula."""
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    c, thr = abs(p["c"]), abs(p["threshold"])
    qp, kp = np.asarray(qp), np.asarray(kp)
    out = np.zeros((p["w2"].shape[1], len(qp), len(kp)))
    for a, i in enumerate(qp):
        for b, j in enumerate(kp):
            x = np.log(c * max(i - j, 0) + 1) / (np.log(c * max(thr, i) + 1) + eps)
            h = np.maximum(x * p["w1"][0] + p["b1"], 0)
            out[:, a, b] = h @ p["w2"] + p["b2"]
    return out


def test_fire_init_params_shapes():
    params = fire.init_params(jax.random.key(0), 3, hidden=8, c=0.2, threshold=64.0)
    assert {k: v.shape for k, v in params.items()} == {
        "w1": (1, 8), "b1": (8,), "w2": (8, 3), "b2": (3,), "c": (), "threshold": (),
    }
    assert float(params["c"]) == pytest.approx(0.2) and float(params["threshold"]) == 64.0
    assert np.abs(np.asarray(params["w2"])).max() <= 1 / np.sqrt(8)


def test_fire_matches_naive_loop():
    params = fire.init_params(jax.random.key(1), 2, hidden=6, threshold=4.0)
    qp, kp = jnp.array([0, 3, 9]), jnp.array([0, 1, 2, 3, 9, 10])
    out = fire.bias(qp, kp, params)
    assert out.shape == (2, 3, 6) and out.dtype == jnp.float32
    np.testing.assert_allclose(out, naive_fire(qp, kp, params), rtol=1e-5, atol=1e-6)
    # Negative learned c and threshold act through their absolute values.
    flipped = dict(params, c=-params["c"], threshold=-params["threshold"])
    np.testing.assert_allclose(fire.bias(qp, kp, flipped), out, rtol=1e-6)


def test_fire_progressive_interpolation_bounds_inputs():
    # Beyond the threshold the MLP input psi(i-j)/psi(i) stays in [0, 1]: with a
    # linear f, the bias at (i, 0) equals f(1) for every long-enough i.
    params = dict(
        w1=jnp.ones((1, 1)), b1=jnp.zeros(1), w2=jnp.ones((1, 1)), b2=jnp.zeros(1), c=jnp.array(0.1), threshold=jnp.array(8.0)
    )
    qp = jnp.array([20, 200, 2000])
    out = fire.bias(qp, jnp.array([0]), params)[0, :, 0]
    np.testing.assert_allclose(out, 1.0, rtol=1e-5)


def test_fire_batch_jit_vmap_grad():
    params = fire.init_params(jax.random.key(2), 2, hidden=4)
    out = jax.jit(fire.bias)(QP, KP, params)
    assert out.shape == (2, 2, 3, 6)
    np.testing.assert_allclose(out[0], naive_fire(QP[0], KP[0], params), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(jax.vmap(fire.bias, in_axes=(0, 0, None))(QP, KP, params), out, rtol=1e-6)
    grads = jax.grad(lambda p: (fire.bias(QP, KP, p) ** 2).sum())(params)
    for name, g in grads.items():
        assert np.isfinite(np.asarray(g)).all(), name
    assert float(jnp.abs(grads["c"])) > 0 and float(jnp.abs(grads["w1"]).sum()) > 0


def test_fire_errors():
    params = fire.init_params(jax.random.key(0), 2, hidden=4)
    with pytest.raises(ValueError, match="FIRE params missing threshold"):
        fire.bias(QP, KP, {k: v for k, v in params.items() if k != "threshold"})
    with pytest.raises(ValueError, match=r"bad FIRE param shapes: .*w2 \(3, 2\)"):
        fire.bias(QP, KP, dict(params, w2=jnp.ones((3, 2))))
    with pytest.raises(ValueError, match="num_heads must be a positive integer, got -1"):
        fire.init_params(jax.random.key(0), -1)
    with pytest.raises(ValueError, match="integer array"):
        fire.bias(QP * 1.0, KP, params)
