"""Tests for posenc.placements: each formula by hand, Mix-LN schedule, errors."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posenc import norms, placements, registry

X = jnp.asarray([[1.0, -2.0, 0.5], [3.0, 0.0, -1.0]])


def F(x):
    return 2.0 * x


def N(x):  # an affine "norm" with slope != 1 so that every formula differs
    return 0.5 * x + 1.0


def N_OUT(x):
    return 3.0 * x


@pytest.mark.parametrize(
    "placement, kwargs, expected",
    [
        ("pre", {}, lambda x: x + 2.0 * (0.5 * x + 1.0)),
        ("post", {}, lambda x: 0.5 * (x + 2.0 * x) + 1.0),
        ("sandwich", {"norm_out": N_OUT}, lambda x: x + 3.0 * (2.0 * (0.5 * x + 1.0))),
        ("reordered", {}, lambda x: x + (0.5 * 2.0 * x + 1.0)),
        ("deepnorm", {"alpha": 2.5}, lambda x: 0.5 * (2.5 * x + 2.0 * x) + 1.0),
        ("rezero", {"gate": jnp.float32(0.25)}, lambda x: x + 0.25 * 2.0 * x),
    ],
)
def test_placement_formulas(placement, kwargs, expected):
    np.testing.assert_allclose(placements.residual(placement, X, F, N, **kwargs), expected(X), rtol=1e-6)


def test_formulas_are_distinct():
    # guards the table above: the simple F, N must tell the placements apart
    outs = [
        np.asarray(placements.residual(p, X, F, N, norm_out=N_OUT, alpha=2.5, gate=jnp.float32(0.25)))
        for p in ("pre", "post", "sandwich", "reordered", "deepnorm", "rezero")
    ]
    for i in range(len(outs)):
        for j in range(i):
            assert not np.allclose(outs[i], outs[j])


def test_rezero_at_init_is_identity_and_gate_gets_gradient():
    y = placements.residual("rezero", X, F, None, gate=jnp.float32(0.0))
    np.testing.assert_array_equal(y, X)
    g = jax.grad(lambda a: jnp.sum(placements.residual("rezero", X, F, None, gate=a)))(jnp.float32(0.0))
    assert float(g) == pytest.approx(float(jnp.sum(2.0 * X)))


def test_deepnorm_default_alpha_is_post():
    np.testing.assert_allclose(
        placements.residual("deepnorm", X, F, N), placements.residual("post", X, F, N), rtol=1e-6
    )


def test_with_real_layer_norm_under_jit():
    d = X.shape[-1]
    p = norms.init_params("layer", d)
    n = functools.partial(norms.normalize, "layer", params=p)
    alpha, _ = norms.deepnorm_constants(12)
    out = jax.jit(lambda x: placements.residual("deepnorm", x, F, n, alpha=alpha))(X)
    np.testing.assert_allclose(out, norms.layer_norm(alpha * X + 2.0 * X, p["scale"], p["bias"]), rtol=1e-5, atol=1e-6)
    pre = placements.residual("pre", X, F, n)
    np.testing.assert_allclose(pre, X + 2.0 * norms.layer_norm(X, p["scale"], p["bias"]), rtol=1e-5, atol=1e-6)


def test_output_keeps_input_dtype():
    xb = X.astype(jnp.bfloat16)
    f32_sublayer = lambda x: (2.0 * x).astype(jnp.float32)  # noqa: E731
    for p, kw in (("pre", {}), ("post", {}), ("rezero", {"gate": jnp.float32(0.5)})):
        y = placements.residual(p, xb, f32_sublayer, N, **kw)
        assert y.dtype == jnp.bfloat16, p


# ------------------------------------------------------------------- Mix-LN


def _schedule(n, **kw):
    return [placements.layer_placement("mixln", i, n, **kw) for i in range(n)]


def test_mixln_schedule_floor_of_fraction():
    assert _schedule(12) == ["post"] * 3 + ["pre"] * 9
    assert _schedule(24) == ["post"] * 6 + ["pre"] * 18
    assert _schedule(6) == ["post"] * 1 + ["pre"] * 5  # floor(1.5) = 1
    assert _schedule(3) == ["pre"] * 3  # floor(0.75) = 0
    assert _schedule(4, mixln_fraction=0.0) == ["pre"] * 4
    assert _schedule(4, mixln_fraction=1.0) == ["post"] * 4
    # float products just below an integer do not lose a layer
    assert placements.num_post_layers(100, mixln_fraction=0.29) == 29
    assert placements.num_post_layers(10, mixln_fraction=0.7) == 7


def test_other_placements_pass_through():
    for p in placements.PLACEMENTS:
        if p != "mixln":
            assert placements.layer_placement(p, 0, 4) == p


def test_has_final_norm():
    expected = {
        "pre": True, "sandwich": True, "reordered": True, "mixln": True,
        "post": False, "deepnorm": False, "rezero": False,
    }
    assert {p: placements.has_final_norm(p) for p in placements.PLACEMENTS} == expected
    assert placements.PLACEMENTS == tuple(registry.PLACEMENTS)


def test_deepnorm_init_gain():
    assert round(placements.deepnorm_init_gain(12), 4) == 0.3195
    assert round(placements.deepnorm_init_gain(6), 4) == 0.3799


# ------------------------------------------------------------------- errors


def test_unknown_placement_lists_all():
    for call in (
        lambda: placements.residual("prenorm", X, F, N),
        lambda: placements.layer_placement("prenorm", 0, 2),
        lambda: placements.has_final_norm("prenorm"),
    ):
        with pytest.raises(ValueError, match="unknown norm placement 'prenorm'") as e:
            call()
        for p in placements.PLACEMENTS:
            assert p in str(e.value)


def test_missing_arguments():
    with pytest.raises(ValueError, match="norm_out"):
        placements.residual("sandwich", X, F, N)
    with pytest.raises(ValueError, match="gate"):
        placements.residual("rezero", X, F, N)
    with pytest.raises(ValueError, match="scalar"):
        placements.residual("rezero", X, F, N, gate=jnp.zeros(3))
    with pytest.raises(ValueError, match="needs a norm"):
        placements.residual("pre", X, F, None)
    with pytest.raises(ValueError, match="layer_placement"):
        placements.residual("mixln", X, F, N)


@pytest.mark.parametrize("fraction", [-0.1, 1.5, float("nan"), "a"])
def test_bad_fraction(fraction):
    with pytest.raises(ValueError, match="mixln_fraction"):
        placements.layer_placement("mixln", 0, 4, mixln_fraction=fraction)


@pytest.mark.parametrize("index, n", [(-1, 4), (4, 4), (1.0, 4), (0, 0)])
def test_bad_layer_index_or_count(index, n):
    with pytest.raises(ValueError, match="layer_index|num_layers"):
        placements.layer_placement("mixln", index, n)
