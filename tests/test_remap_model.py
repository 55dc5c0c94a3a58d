"""Training-free remappings of a RoPE model (``model.position.rope.remap``) in attention.

The reference is independent of the regions: one attention layer in numpy float64 whose logit
of (i, j) is q_i . R(d_ij) k_j with d_ij the method's pure ``relative_positions`` (a float where
the method makes fractional distances; NaN: masked), i.e. sum over pairs of
cos(d theta) (q_a k_a + q_b k_b) + sin(d theta) (q_a k_b - q_b k_a). The model must match it
(dense), match itself blocked and in cached decoding token by token, equal plain RoPE when the
method's window covers the sequence, and refuse bad options with one line.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import helpers
from posenc import dual_chunk, rerope, self_extend, sinks, string_shift

L = 13

# name -> (model.position.rope options, the pure relative_positions with those options)
METHODS = {
    "self_extend": (dict(group=3, window=4), functools.partial(self_extend.relative_positions, group=3,
                                                               window=4)),
    "rerope": (dict(window=3), functools.partial(rerope.relative_positions, window=3)),
    "leaky_rerope": (dict(window=3, leaky=2.0),
                     functools.partial(rerope.relative_positions, window=3, leaky=2.0)),
    "dual_chunk": (dict(chunk=6, local_window=2),
                   functools.partial(dual_chunk.relative_positions, chunk=6, local_window=2)),
    "string": (dict(shift=5, local_window=2),
               functools.partial(string_shift.relative_positions, shift=5, local_window=2)),
    "streaming_llm": (dict(sinks=2, window=3), functools.partial(sinks.relative_positions, sinks=2,
                                                                 window=3)),
    "lm_infinite": (dict(global_branch=2, local_branch=4, limit=4),
                    functools.partial(sinks.lm_infinite_relative_positions, global_branch=2,
                                      local_branch=4, limit=4)),
}


def position(method, **extra):
    opts, _ = METHODS[method]
    return dict(remap=method.replace("leaky_", ""), **opts, **extra)


def reference_attention(attn, x, positions, rel):
    """The attention sublayer in float64 numpy from relative distances ``rel`` [L, L] (NaN: masked)."""
    q, k, v = (np.asarray(a, np.float64) for a in attn.project(x)[:3])
    enc = attn.encoding
    inv_freq, factor = enc.frequencies(0)
    inv = np.asarray(inv_freq, np.float64)
    half = len(inv)
    theta = np.nan_to_num(rel)[..., None] * inv  # [L, L, d/2]
    qa, qb, ka, kb = q[..., :half], q[..., half:2 * half], k[..., :half], k[..., half:2 * half]
    dot = np.einsum("bihp,bjhp->bhijp", qa, ka) + np.einsum("bihp,bjhp->bhijp", qb, kb)
    cross = np.einsum("bihp,bjhp->bhijp", qa, kb) - np.einsum("bihp,bjhp->bhijp", qb, ka)
    s = (np.cos(theta) * dot + np.sin(theta) * cross).sum(-1)
    s = s * float(factor) ** 2 * attn.scale
    s = np.where(np.isnan(rel), -np.inf, s)
    w = np.exp(s - s.max(-1, keepdims=True))
    w = w / w.sum(-1, keepdims=True)
    out = np.einsum("bhij,bjhd->bihd", w, v)
    wo = np.asarray(attn.wo[...], np.float64)
    return out.reshape(out.shape[:2] + (-1,)) @ wo.reshape(-1, wo.shape[-1])


@pytest.mark.parametrize("method,extra", [(m, {}) for m in METHODS] + [
    ("self_extend", dict(scaling="ntk", factor=2.0)),  # Self-Extend with NTK: frequencies scaled
    ("dual_chunk", dict(scaling="yarn", factor=2.0)),  # DCA with YaRN (attention factor != 1)
])
def test_attention_equals_the_reference_of_the_pure_relative_positions(method, extra):
    model = helpers.decoder("rope", position=position(method, **extra), num_layers=1, perturb=0.05)
    attn = model.blocks[0].attn
    x = jax.random.normal(jax.random.key(1), (2, L, 32), jnp.float32)
    positions = jnp.arange(L)[None]
    got = attn.forward(x, positions, seq_len=L)
    rel = np.asarray(METHODS[method][1](np.arange(L), np.arange(L)), np.float64)
    np.testing.assert_allclose(np.asarray(got), reference_attention(attn, x, positions, rel),
                               rtol=1e-4, atol=2e-5)


@pytest.fixture(scope="module")
def paths():
    """Per method: (dense logits, blocked logits, cached token by token, plain RoPE) in one jit."""
    t = helpers.tokens(2, L)
    out = {}
    plain = helpers.decoder("rope", num_layers=1, perturb=0.05)(t)
    for method in METHODS:
        dense = helpers.decoder("rope", position=position(method), num_layers=1, perturb=0.05)
        blocked = helpers.decoder("rope", position=position(method), num_layers=1, perturb=0.05,
                                  attention_impl="blocked", attention_block=4)
        g, state = nnx.split(dense)

        @jax.jit
        def run(state, blocked_state, tokens):
            m = nnx.merge(g, state)
            b = nnx.merge(gb, blocked_state)
            cached, _ = helpers.decode_stepwise(m, tokens, 5, L + 3)
            return m(tokens), b(tokens), cached

        gb, bstate = nnx.split(blocked)
        out[method] = run(state, bstate, t) + (plain,)
    return out


@pytest.mark.parametrize("method", METHODS)
def test_blocked_and_cached_decoding_equal_the_dense_forward(paths, method):
    dense, blocked, cached, plain = (np.asarray(a) for a in paths[method])
    np.testing.assert_allclose(blocked, dense, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(cached, dense, rtol=1e-5, atol=2e-5)
    assert np.abs(dense - plain).max() > 1e-3  # the remapping changed the logits


# Windows covering the whole sequence: every pair keeps its RoPE distance.
COVERING = {
    "self_extend": dict(group=4, window=L), "rerope": dict(window=L), "dual_chunk": dict(chunk=L + 2,
                                                                                       local_window=2),
    "string": dict(shift=L, local_window=3), "streaming_llm": dict(sinks=2, window=L),
    "lm_infinite": dict(global_branch=2, local_branch=L, limit=L),
}


def test_a_window_covering_the_sequence_is_plain_rope():
    t = helpers.tokens(2, L)
    plain = np.asarray(helpers.decoder("rope", num_layers=1, perturb=0.05)(t))
    for method, opts in COVERING.items():
        got = helpers.decoder("rope", position=dict(remap=method, **opts), num_layers=1, perturb=0.05)(t)
        np.testing.assert_allclose(np.asarray(got), plain, rtol=1e-5, atol=2e-5, err_msg=method)


@pytest.mark.parametrize("position_options,message", [
    (dict(remap="self_extend", group=2), r"^model.position.rope.remap='self_extend' needs "
                                         r"model.position.rope.window \(it reads group, window\)$"),
    (dict(remap="selfextend"), r"remap 'selfextend'; choose one of: dual_chunk, lm_infinite, none, "
                               r"rerope, self_extend, streaming_llm, string$"),
    (dict(remap="rerope", window=3, group=2), r"model.position.rope.group=2 is set, but rope does not "
                                              r"use it"),
    (dict(remap="rerope", window=3, leaky=1.5), r"^model.position.rope \(remap 'rerope'\): window \* "
                                                r"\(leaky - 1\) must be an integer"),
    (dict(remap="dual_chunk", chunk=4, local_window=4), r"^model.position.rope \(remap 'dual_chunk'\): "
                                                        r"local_window must be < chunk"),
    (dict(remap="string", shift=4, local_window=2, scaling="dynamic"),
     r"scaling='dynamic' does \(choose one of: default, linear, ntk, yarn, llama3, proportional\)$"),
    (dict(group=2), r"model.position.rope.group=2 is set, but rope does not use it"),
])
def test_bad_remap_options_are_one_line_errors(position_options, message):
    with pytest.raises(ValueError, match=message) as e:
        helpers.spec("rope", position=position_options)
    assert "\n" not in str(e.value)


def test_remap_refuses_qk_norm_after_rope_and_xpos():
    with pytest.raises(ValueError, match=r"qk_norm_after_rope=True and model.position.rope.remap="
                                         r"'rerope' cannot be combined"):
        helpers.spec("rope", position=dict(remap="rerope", window=3),
                     norm=dict(qk_norm="rms", qk_norm_after_rope=True))
    with pytest.raises(ValueError, match=r"attention_impl='pallas' needs encodings with an in-kernel form; "
                                         r"rope has none"):
        helpers.spec("rope", position=dict(remap="rerope", window=3), attention_impl="pallas")
    with pytest.raises(ValueError, match=r"model.position.xpos.remap='rerope': xPos"):
        helpers.spec("xpos", position=dict(remap="rerope", window=3))
