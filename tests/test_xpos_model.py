"""xPos in the decoder: nothing may normalise its counter-scaled queries and keys.

xPos multiplies a query at m by zeta^((m - c) / scale_base) and a key at n by the inverse, about an
offset c that cancels in q . k (the full forward centres it, decoding puts it at the query). A norm of
the scaled q and k (nGPT, a QK-norm after the rotation) keeps c in the logits: cached decoding then
differs from the full forward, so validation refuses both before anything compiles.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import helpers
from posenc import ngpt, rope, xpos


def _logit(q, k, m, n, offset, *, normalised):
    inv_freq, _ = rope.frequencies("default", q.shape[-1])
    qs, ks = xpos.apply_pair(q, k, jnp.array([[m]]), jnp.array([[n]]), inv_freq, offset=jnp.array([offset]))
    if normalised:
        qs, ks = ngpt.normalize(qs), ngpt.normalize(ks)
    return float(jnp.sum(qs * ks))


@pytest.mark.parametrize("span", [4, 512, 4096])
def test_normalising_the_scaled_q_and_k_leaves_the_offset_in_the_logit(span):
    """Plain xPos: q . k is the same at every offset (the query's, the centre, the key's). Normalised
    (nGPT's s_qk * q / |q|): the pairs' factors move with the offset unevenly, and so does the logit,
    by more the further apart the query and the key are."""
    kq, kk = jax.random.split(jax.random.key(0))
    q, k = jax.random.normal(kq, (1, 1, 1, 8)), jax.random.normal(kk, (1, 1, 1, 8))
    offsets = (span, span // 2, 0)  # query at span, key at 0
    plain = [_logit(q, k, span, 0, c, normalised=False) for c in offsets]
    normed = [_logit(q, k, span, 0, c, normalised=True) for c in offsets]
    np.testing.assert_allclose(plain, plain[0], rtol=1e-5)
    spread = max(normed) - min(normed)
    assert spread > {4: 1e-4, 512: 1e-2, 4096: 0.1}[span], normed


def test_ngpt_refuses_xpos_in_one_line():
    fields = dict(norm=dict(placement="ngpt"), mlp="swiglu")
    with pytest.raises(ValueError, match=r"^model.norm.placement='ngpt' cannot be combined with position kind "
                                         r"'xpos' \(layer 0\): it scales q and k by reciprocal factors about an "
                                         r"offset that cancels only in q . k, .*choose another kind or placement$"):
        helpers.spec("xpos", **fields)
    helpers.spec("rope", **fields)  # the rotation alone is norm-preserving: accepted


def test_a_qk_norm_after_the_rotation_refuses_xpos_in_one_line():
    norm = dict(qk_norm="rms", qk_norm_after_rope=True)
    with pytest.raises(ValueError, match=r"^model.norm.qk_norm_after_rope=True cannot follow position kind 'xpos' "
                                         r"\(layer 0\): .*cached decoding would differ from the full forward\); "
                                         r"set qk_norm_after_rope=False$"):
        helpers.spec("xpos", norm=norm)
    helpers.spec("xpos", norm=dict(qk_norm="rms"))  # normalising the projections, before xPos: accepted


def test_only_xpos_counter_scales_among_the_built_ins():
    from posenc.model import ENCODINGS
    from posenc.model.registry import read_options

    scaled = [k for k, cls in ENCODINGS.items() if cls.counter_scales_qk(read_options(k, None))]
    assert scaled == ["xpos"]
