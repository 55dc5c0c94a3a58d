"""posenc.kerple / posenc.fire: formulas, the reference implementations transcribed in NumPy,
the stored-parameter constraint of KERPLE, FIRE's L_multiplier parameterisation and its
gradient, jit / vmap / grad, errors."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
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


# KERPLE reference, transcribed from chijames/KERPLE, megatron/mpu/layers.py:
# ParallelKerpleLog.forward and ParallelKerplePower.forward (bias kernel only,
# wei_a = wei_p = None), parameters [H, 1, 1], x the [b, np, sq, sk] scores.
EPS = 1e-2


def ref_diff(seq_len_k):
    return np.tril(np.tile(np.arange(seq_len_k).reshape(seq_len_k, 1), (1, seq_len_k))
                   + np.arange(0, -seq_len_k, -1)).astype(np.float64)


def ref_kerple_log(x, bias_p, bias_a):
    seq_len_q, seq_len_k = x.shape[-2], x.shape[-1]
    diff = ref_diff(seq_len_k)
    bias_p = np.clip(bias_p, EPS, None)  # bias_p.data = bias_p.data.clamp(min=self.eps)
    bias_a = np.clip(bias_a, EPS, None)
    bias = -bias_p * np.log(1 + bias_a * diff)
    if seq_len_q != seq_len_k:
        assert seq_len_q == 1
        bias = bias[:, seq_len_k - 1, :].reshape(bias.shape[0], 1, bias.shape[2])
    return x + bias


def ref_kerple_power(x, bias_p, bias_a):
    seq_len_q, seq_len_k = x.shape[-2], x.shape[-1]
    diff = ref_diff(seq_len_k)
    bias_p = np.clip(bias_p, EPS, 2)  # clamp(min=self.eps, max=2)
    bias = diff ** bias_p
    bias_a = np.clip(bias_a, EPS, None)
    bias = -bias * bias_a
    if seq_len_q != seq_len_k:
        assert seq_len_q == 1
        bias = bias[:, seq_len_k - 1, :].reshape(bias.shape[0], 1, bias.shape[2])
    return x + bias


@pytest.mark.parametrize("kind, ref", [("log", ref_kerple_log), ("power", ref_kerple_power)])
def test_kerple_matches_reference(kind, ref):
    # a, p include values below / above the bounds the reference clamps to.
    a = np.array([0.5, 0.005, 1.3])
    p = np.array([1.7, 0.3, 2.6]) if kind == "power" else np.array([1.7, -0.2, 2.6])
    n = 9
    want = ref(np.zeros((1, 3, n, n)), p[:, None, None], a[:, None, None])[0]
    got = kerple.bias(jnp.arange(n), jnp.arange(n), jnp.asarray(a), jnp.asarray(p), kind=kind)
    causal = np.tril(np.ones((n, n), bool))  # the reference's tril zeroes the masked entries
    np.testing.assert_allclose(np.asarray(got)[:, causal], want[:, causal], rtol=1e-5, atol=1e-6)
    # decoding: one query at position n - 1 against n cached keys
    want1 = ref(np.zeros((1, 3, 1, n)), p[:, None, None], a[:, None, None])[0]
    got1 = kerple.bias(jnp.array([n - 1]), jnp.arange(n), jnp.asarray(a), jnp.asarray(p), kind=kind)
    np.testing.assert_allclose(got1, want1, rtol=1e-5, atol=1e-6)


def test_kerple_constrain_is_the_reference_clamp():
    a = jnp.array([-1.0, 0.005, 0.5, 3.0])
    p = jnp.array([-2.0, 0.001, 1.5, 5.0])
    ca, cp = kerple.constrain(a, p, kind="log")
    np.testing.assert_array_equal(ca, np.clip(np.asarray(a), 0.01, None))
    np.testing.assert_array_equal(cp, np.clip(np.asarray(p), 0.01, None))  # log: no upper bound
    ca, cp = kerple.constrain(a, p, kind="power")
    np.testing.assert_array_equal(cp, np.clip(np.asarray(p), 0.01, 2.0))
    # in range: unchanged; dtype kept; traced values fine
    assert kerple.constrain(ca, cp, kind="power")[1].tolist() == cp.tolist()
    b16 = kerple.constrain(a.astype(jnp.bfloat16), p.astype(jnp.bfloat16), kind="power")
    assert b16[0].dtype == b16[1].dtype == jnp.bfloat16
    np.testing.assert_array_equal(jax.jit(kerple.constrain, static_argnames="kind")(a, p, kind="power")[1], cp)
    with pytest.raises(ValueError, match="unknown kind 'exp'; choose one of: log, power"):
        kerple.constrain(a, p, kind="exp")


def test_kerple_constrained_parameter_returns_to_the_bound_and_keeps_a_gradient():
    # A loss that wants a smaller a drives it to the bound; then the loss flips.
    q = k = jnp.arange(16)
    p = jnp.ones(1)

    def loss(a, sign):
        return -sign * jnp.sum(kerple.bias(q, k, a, p))  # bias = -p log(1 + a d) <= 0: sign 1 wants a -> 0

    def train(constrained, steps_down, steps_up):
        tx = optax.adam(0.05)
        a = jnp.array([0.2])
        state = tx.init(a)
        trace = []
        for t in range(steps_down + steps_up):
            g = jax.grad(loss)(a, 1.0 if t < steps_down else -1.0)
            assert np.isfinite(np.asarray(g)).all() and float(jnp.abs(g)[0]) > 0
            upd, state = tx.update(g, state)
            a = optax.apply_updates(a, upd)
            if constrained:
                a, _ = kerple.constrain(a, p)
            trace.append(float(a[0]))
        return trace

    on = train(True, 60, 30)
    assert on[59] == pytest.approx(kerple.MIN_PARAM)  # held at the bound, not below
    # leaves it once Adam's momentum turns (6 steps here) and keeps climbing
    assert on[70] > kerple.MIN_PARAM and on[-1] > 0.3
    off = train(False, 60, 30)
    assert off[59] < -2.0  # unconstrained: the stored value drifted far below the bound
    # ... where the (clamped) bias does not move: 30 steps after the reversal it is still stuck
    assert max(off[60:]) < kerple.MIN_PARAM
    np.testing.assert_array_equal(kerple.bias(q, k, jnp.array([off[-1]]), p),
                                  kerple.bias(q, k, jnp.array([kerple.MIN_PARAM]), p))


# ------------------------------------------------------------------- FIRE


# FIRE reference, transcribed from the paper's module (Li et al. 2023, appendix; the same code
# is mcleish7/arithmetic, cramming/architectures/embeddings.py, class FIRE, forward). The
# reference draws its positions itself (eval mode: arange(seq_length)); here they are given.
class RefFIRE:
    def __init__(self, params, init_L=512.0, eps=1e-6):
        p = {k: np.asarray(v, np.float64) for k, v in params.items()}
        # torch.nn.Linear(1, mlp_width), Linear(mlp_width, num_heads): weight [out, in]
        self.W1, self.B1, self.W2, self.B2 = p["w1"].T, p["b1"], p["w2"].T, p["b2"]
        self.c = p["c"]
        self.init_L = np.float64(init_L)  # Parameter(requires_grad=False)
        self.L_multiplier = p["L_multiplier"]
        self.eps = eps

    def mlp(self, x):
        return np.maximum(x @ self.W1.T + self.B1, 0) @ self.W2.T + self.B2

    def forward(self, positions):
        positions = np.asarray(positions, np.float64)
        relative_distances = positions[:, None] - positions[None, :]
        threshold = np.abs(self.L_multiplier * self.init_L)
        position_normalizer = np.maximum(positions, threshold)[:, None]
        relative_distances = np.log(np.abs(self.c * relative_distances) + 1)
        position_normalizer = np.log(np.abs(self.c * position_normalizer) + 1)
        normalized_distances = relative_distances / (position_normalizer + self.eps)
        fire_bias = self.mlp(normalized_distances[..., None])[None]
        return fire_bias.transpose(0, 3, 1, 2)


def test_fire_init_params_layout():
    params = fire.init_params(jax.random.key(0), 3, hidden=8, c=0.2)
    assert {k: v.shape for k, v in params.items()} == {
        "w1": (1, 8), "b1": (8,), "w2": (8, 3), "b2": (3,), "c": (), "L_multiplier": (),
    }
    assert float(params["c"]) == pytest.approx(0.2) and float(params["L_multiplier"]) == 1.0
    assert np.abs(np.asarray(params["w2"])).max() <= 1 / np.sqrt(8)
    assert np.abs(np.asarray(params["w1"])).max() <= 1.0  # U(-1, 1): fan_in 1
    legacy = fire.init_params(jax.random.key(0), 3, hidden=8, threshold=64.0)
    assert "L_multiplier" not in legacy and float(legacy["threshold"]) == 64.0
    assert float(fire.effective_threshold(params)) == 512.0
    assert float(fire.effective_threshold(params, init_L=64.0)) == 64.0


@pytest.mark.parametrize("init_L, multiplier", [(512.0, 1.0), (8.0, 0.7), (8.0, -1.3)])
def test_fire_matches_reference(init_L, multiplier):
    params = dict(fire.init_params(jax.random.key(1), 2, hidden=6), L_multiplier=jnp.float32(multiplier))
    ref = RefFIRE(params, init_L=init_L)
    # eval-mode positions arange(L), and sorted random positions (the reference's randomized mode)
    for pos in (np.arange(20), np.sort(np.random.default_rng(0).choice(200, 20, replace=False))):
        want = ref.forward(pos)[0]
        got = fire.bias(jnp.asarray(pos), jnp.asarray(pos), params, init_L=init_L)
        assert got.shape == (2, 20, 20) and got.dtype == jnp.float32
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        # Lq != Lk (decoding / query blocks): the rows of the square bias
        rows = np.array([0, 7, 19])
        np.testing.assert_allclose(fire.bias(jnp.asarray(pos[rows]), jnp.asarray(pos), params, init_L=init_L),
                                   want[:, rows], rtol=1e-5, atol=1e-6)
    # The legacy layout with threshold = |multiplier| init_L is the same function.
    legacy = {k: v for k, v in params.items() if k != "L_multiplier"}
    legacy["threshold"] = jnp.float32(multiplier * init_L)
    np.testing.assert_allclose(fire.bias(jnp.arange(20), jnp.arange(20), legacy),
                               ref.forward(np.arange(20))[0], rtol=1e-5, atol=1e-6)


def test_fire_multiplier_gradient_is_init_L_times_larger():
    params = fire.init_params(jax.random.key(3), 2, hidden=4)
    legacy = dict({k: v for k, v in params.items() if k != "L_multiplier"}, threshold=jnp.float32(512.0))
    pos = jnp.arange(32)  # queries below the threshold: it is the normaliser

    def loss(p):
        return jnp.sum(fire.bias(pos, pos, p) ** 2)

    g_mult = jax.grad(loss)(params)["L_multiplier"]
    g_thr = jax.grad(loss)(legacy)["threshold"]
    assert float(jnp.abs(g_thr)) > 0
    np.testing.assert_allclose(g_mult, 512.0 * g_thr, rtol=1e-4)
    # One Adam step (lr 1e-3) moves the effective threshold by ~0.5 through the multiplier,
    # by ~1e-3 when it is learned directly.
    tx = optax.adam(1e-3)
    moved = []
    for p in (params, legacy):
        upd, _ = tx.update(jax.grad(loss)(p), tx.init(p))
        new = optax.apply_updates(p, upd)
        moved.append(abs(float(fire.effective_threshold(new)) - 512.0))
    np.testing.assert_allclose(moved, [0.512, 0.001], rtol=0.03)  # 512 - 1e-3 rounds in float32 (ulp 6e-5)


def test_fire_progressive_interpolation_bounds_inputs():
    # Beyond the threshold the MLP input psi(i-j)/psi(i) stays in [0, 1]: with a
    # linear f, the bias at (i, 0) equals f(1) for every long-enough i.
    params = dict(w1=jnp.ones((1, 1)), b1=jnp.zeros(1), w2=jnp.ones((1, 1)), b2=jnp.zeros(1), c=jnp.array(0.1),
                  L_multiplier=jnp.array(1.0))
    qp = jnp.array([20, 200, 2000])
    out = fire.bias(qp, jnp.array([0]), params, init_L=8.0)[0, :, 0]
    np.testing.assert_allclose(out, 1.0, rtol=1e-5)
    x = fire.inputs(jnp.arange(50), jnp.arange(50), 0.1, 8.0)
    assert float(x.min()) >= 0 and float(jnp.tril(x).max()) <= 1.0


def test_fire_batch_jit_vmap_grad():
    params = fire.init_params(jax.random.key(2), 2, hidden=4)
    out = jax.jit(fire.bias)(QP, KP, params)
    assert out.shape == (2, 2, 3, 6)
    ref = RefFIRE(params)
    for b in range(2):  # rows = the query positions among the keys
        want = ref.forward(np.asarray(KP[b]))[0][:, np.searchsorted(np.asarray(KP[b]), np.asarray(QP[b]))]
        np.testing.assert_allclose(out[b], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(jax.vmap(fire.bias, in_axes=(0, 0, None))(QP, KP, params), out, rtol=1e-6)
    grads = jax.grad(lambda p: (fire.bias(QP, KP, p) ** 2).sum())(params)
    for name, g in grads.items():
        assert np.isfinite(np.asarray(g)).all(), name
    assert float(jnp.abs(grads["c"])) > 0 and float(jnp.abs(grads["w1"]).sum()) > 0
    assert float(jnp.abs(grads["L_multiplier"])) > 0


def test_fire_errors():
    params = fire.init_params(jax.random.key(0), 2, hidden=4)
    with pytest.raises(ValueError, match="FIRE params missing L_multiplier"):
        fire.bias(QP, KP, {k: v for k, v in params.items() if k != "L_multiplier"})
    with pytest.raises(ValueError, match="FIRE params hold both L_multiplier and threshold"):
        fire.bias(QP, KP, dict(params, threshold=jnp.float32(1.0)))
    with pytest.raises(ValueError, match=r"bad FIRE param shapes: .*w2 \(3, 2\)"):
        fire.bias(QP, KP, dict(params, w2=jnp.ones((3, 2))))
    with pytest.raises(ValueError, match="num_heads must be an integer >= 1; got -1"):
        fire.init_params(jax.random.key(0), -1)
    with pytest.raises(ValueError, match="integer array"):
        fire.bias(QP * 1.0, KP, params)
    with pytest.raises(ValueError, match=re.escape("init_L must be a finite number > 0; got 0.0")):
        fire.bias(QP, KP, params, init_L=0.0)
    legacy = fire.init_params(jax.random.key(0), 2, hidden=4, threshold=64.0)
    with pytest.raises(ValueError, match="init_L applies to params with L_multiplier"):
        fire.bias(QP, KP, legacy, init_L=64.0)
