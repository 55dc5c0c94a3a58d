"""Tests for posenc.placements: each formula by hand, Mix-LN schedule, errors."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posenc import norms, placements

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
    norm = None if placement == "rezero" else N
    np.testing.assert_allclose(placements.residual(placement, X, F, norm, **kwargs), expected(X), rtol=1e-6)


KWARGS = {"sandwich": {"norm_out": N_OUT}, "deepnorm": {"alpha": 2.5},
          "rezero": {"gate": jnp.float32(0.25)}}


def _residual(p, x, sublayer):
    return placements.residual(p, x, sublayer, None if p == "rezero" else N, **KWARGS.get(p, {}))


def test_formulas_are_distinct():
    # guards the table above: the simple F, N must tell the placements apart
    outs = [np.asarray(_residual(p, X, F))
            for p in ("pre", "post", "sandwich", "reordered", "deepnorm", "rezero")]
    for i in range(len(outs)):
        for j in range(i):
            assert not np.allclose(outs[i], outs[j])


@pytest.mark.parametrize("placement, keyword", [
    ("pre", {"alpha": 2.0}), ("post", {"norm_out": N_OUT}), ("sandwich", {"norm_out": N_OUT, "gate": 1.0}),
    ("deepnorm", {"alpha": 2.0, "norm_out": N_OUT}), ("reordered", {"gate": jnp.float32(0.5)}),
])
def test_a_keyword_the_placement_does_not_use_is_refused(placement, keyword):
    with pytest.raises(ValueError, match=f"placement {placement!r} does not use .*; it takes: "):
        placements.residual(placement, X, F, N, **keyword)
    with pytest.raises(ValueError, match="placement 'rezero' uses no norm"):
        placements.residual("rezero", X, F, N, gate=jnp.float32(0.0))
    with pytest.raises(ValueError, match="placement 'pre' does not use mixln_fraction"):
        placements.layer_placement("pre", 0, 4, mixln_fraction=0.5)


def test_rezero_at_init_is_identity_and_gate_gets_gradient():
    y = placements.residual("rezero", X, F, None, gate=jnp.float32(0.0))
    np.testing.assert_array_equal(y, X)
    g = jax.grad(lambda a: jnp.sum(placements.residual("rezero", X, F, None, gate=a)))(jnp.float32(0.0))
    assert float(g) == pytest.approx(float(jnp.sum(2.0 * X)))


def test_deepnorm_with_alpha_one_is_post():
    np.testing.assert_allclose(
        placements.residual("deepnorm", X, F, N, alpha=1.0), placements.residual("post", X, F, N),
        rtol=1e-6)


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
    for p, norm, kw in (("pre", N, {}), ("post", N, {}), ("rezero", None, {"gate": jnp.float32(0.5)})):
        y = placements.residual(p, xb, f32_sublayer, norm, **kw)
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


@pytest.mark.parametrize("placement", list(placements.PLACEMENTS))
def test_the_head_sees_a_normalized_stream_unless_rezero(placement):
    """Behaviour behind has_final_norm: with RMSNorm (gain 1 at init) the stream entering the
    head has RMS 1 whether the last layer ends in a norm (post, deepnorm) or the decoder adds a
    final norm (pre, sandwich, reordered, mixln); nGPT's stream has L2 norm 1; ReZero has
    neither. The stream is recovered
    from the logits through the tied embedding (vocab > d_model: a left inverse exists)."""
    from flax import nnx

    from posenc.model import Decoder, model_config

    c = model_config()
    c.update(vocab_size=32, d_model=16, num_layers=2, num_heads=2)
    c.norm.placement = placement
    sphere = placements.PLACEMENTS[placement].sphere  # nGPT: unit L2 norm, s_z 1 at init
    if sphere:
        c.mlp = "swiglu"
    model = Decoder(c, rngs=nnx.Rngs(0))
    if placement == "rezero":  # gates start at 0 (identity layers): open them
        for block in model.blocks:
            block.gate[...] = jnp.float32(1.0)
    x = 3.0 * jax.random.normal(jax.random.key(0), (1, 5, 16))
    logits = np.asarray(model.forward_embeddings(x), np.float64)[0]
    emb = np.asarray(model.embedding[...], np.float64)  # [V, D]; logits = h @ emb.T
    h = logits @ np.linalg.pinv(emb.T)
    rms = np.linalg.norm(h, axis=-1) if sphere else np.sqrt(np.mean(np.square(h), -1))
    assert np.allclose(rms, 1.0, atol=1e-3) == (placement != "rezero"), (placement, rms)


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


@pytest.mark.parametrize("placement, block", [("hybrid", "posenc.hybrid_norm.block"),
                                              ("hybrid_star", "posenc.hybrid_norm.block"),
                                              ("lns", "posenc.layernorm_scaling.block")])
def test_whole_layer_placements_name_their_block_function(placement, block):
    with pytest.raises(ValueError, match=f"placement {placement!r} acts on a whole layer: use {block}"):
        placements.residual(placement, X, F, N)
    assert placements.has_final_norm(placement) and placements.layer_placement(placement, 0, 2) == placement
    assert placements.PLACEMENTS[placement].qkv_norm == placement.startswith("hybrid")


def test_missing_arguments():
    with pytest.raises(ValueError, match="norm_out"):
        placements.residual("sandwich", X, F, N)
    with pytest.raises(ValueError, match="gate"):
        placements.residual("rezero", X, F)
    with pytest.raises(ValueError, match="alpha"):
        placements.residual("deepnorm", X, F, N)
    with pytest.raises(ValueError, match="scalar"):
        placements.residual("rezero", X, F, gate=jnp.zeros(3))
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
