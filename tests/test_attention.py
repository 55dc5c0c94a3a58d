"""Attention: blocked (online softmax) == causal query blocks == dense, forward and gradient."""

import math
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import helpers
from posenc.model.attention import AttentionCall, attention, dense_attention
from posenc.model.options import options_of

B, L, H, K, DH, BLOCK = 2, 13, 4, 2, 8, 4  # L not a multiple of BLOCK; GQA 4 heads / 2 kv heads


def _encoding(kind):
    """The first layer's unit of a small model of ``kind``, parameters perturbed so that
    zero-initialised ones (CoPE's embeddings) contribute."""
    model = helpers.decoder(kind, num_heads=H, num_kv_heads=K, train_length=32, perturb=0.05)
    return model.blocks[0].attn.encoding


def _inputs(seed=0):
    kq, kk, kv, kp, kc = jax.random.split(jax.random.key(seed), 5)
    q = jax.random.normal(kq, (B, L, H, DH))
    k = jax.random.normal(kk, (B, L, K, DH))
    v = jax.random.normal(kv, (B, L, K, DH))
    # Gaps and an offset: positions need not be arange.
    positions = 5 + jnp.cumsum(jax.random.randint(kp, (B, L), 1, 3), axis=-1)
    cot = jax.random.normal(kc, (B, L, H, DH))
    return q, k, v, positions, cot


def _run(enc, *, causal=True, softcap=0.0, return_stats=False):
    """One jit: (out, grads wrt params, q, k, v, stats) for dense, dense in causal query
    blocks (L = 13 in blocks of 4: the last one partial) and blocked attention."""
    g, params, rest = nnx.split(enc, nnx.Param, ...)
    q, k, v, positions, cot = _inputs()
    axes = type(enc).position_axes({n: getattr(enc, n) for n in options_of(type(enc))})
    if axes > 1:  # M-RoPE, 2D RoPE: positions [B, L, A] that differ by axis
        positions = jnp.stack([positions + (a * positions) % 3 for a in range(axes)], axis=-1)

    x = jax.random.normal(jax.random.key(9), (B, L, enc.d_model))

    def f(impl, params, q, k, v):
        e = nnx.merge(g, params, rest)
        impl, causal_block = ("dense", BLOCK) if impl == "split" else (impl, 0)
        # Data-dependent units (FoX, PaTH) take their per-token terms from a layer input.
        q, k, v, feats, _ = e.prepare(x, q, k, v, positions, state=e.init_state(B))
        qq, kk = e.qk(q, k, positions, positions, seq_len=L)
        res = attention(qq, kk, v, positions, positions, e, AttentionCall(
            scale=1 / math.sqrt(DH), causal=causal, softcap=softcap, impl=impl, block=BLOCK,
            causal_block=causal_block, stats=return_stats, q_features=feats,
            k_features={n: feats[n] for n in type(e).cached_features}))
        return res if return_stats else (res, None)

    def loss(params, q, k, v, impl):
        out, stats = f(impl, params, q, k, v)
        return jnp.sum(out * cot), (out, stats)

    @jax.jit
    def both(params, q, k, v):
        res = []
        for impl in ("dense", "split", "blocked"):
            grads, (out, stats) = jax.grad(loss, argnums=(0, 1, 2, 3), has_aux=True)(
                params, q, k, v, impl)
            res.append((out, grads, stats))
        return res

    return both(params, q, k, v)


def _close(a, b, rtol=2e-5, atol=2e-5):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


# Embedding kinds (sinusoidal, learned) do nothing inside attention: they are NoPE here.
ATTENTION_KINDS = helpers.attention_kinds()


@pytest.mark.parametrize("kind", ATTENTION_KINDS)
def test_blocked_matches_dense_forward_and_gradient(kind):
    enc = _encoding(kind)
    (out_d, grads_d, _), (out_s, grads_s, _), (out_b, grads_b, _) = _run(enc)
    assert out_b.shape == out_s.shape == (B, L, H, DH)
    _close(out_b, out_d)
    _close(grads_b, grads_d)
    _close(out_s, out_d)
    _close(grads_s, grads_d)
    # The gradient reaches the encoding's parameters (when it has any).
    for leaf in jax.tree.leaves(grads_d[0]):
        assert float(jnp.abs(leaf).max()) > 0


@pytest.mark.parametrize("kind", ["shaw"])
def test_blocked_stats_softcap_and_noncausal_match_dense(kind):
    enc = _encoding(kind)
    for causal in (True, False):
        (out_d, grads_d, st_d), (out_s, grads_s, st_s), (out_b, grads_b, st_b) = _run(
            enc, causal=causal, softcap=2.0, return_stats=True)
        _close((out_b, grads_b), (out_d, grads_d))
        _close((out_s, grads_s), (out_d, grads_d))
        _close(st_b, st_d, rtol=1e-5, atol=1e-5)
        _close(st_s, st_d, rtol=1e-5, atol=1e-5)
        assert float(st_d["max_attention_logit"]) <= 2.0  # soft-capped
        assert 0.0 < float(st_d["attention_entropy"]) < math.log(L)


def test_dense_fast_path_matches_manual_path():
    """jax.nn.dot_product_attention (no content terms) == the manual einsum path."""
    enc = _encoding("alibi")
    q, k, v, positions, _ = _inputs(1)
    kw = dict(scale=1 / math.sqrt(DH))
    fast = dense_attention(q, k, v, positions, positions, enc, AttentionCall(**kw))
    manual, _ = dense_attention(q, k, v, positions, positions, enc, AttentionCall(stats=True, **kw))
    _close(fast, manual, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("q_offset,kv_length", [(3, None), (6, 5), (0, 0)])
def test_causal_blocks_with_offset_and_kv_length_match_one_block(q_offset, kv_length):
    """Static q_offset / kv_length (a prefix of cached keys): blocks == one softmax; no key
    visible (kv_length 0) gives zeros in both."""
    enc = _encoding("t5")
    q, k, v, positions, _ = _inputs(3)
    kw = dict(scale=0.5, q_offset=q_offset, kv_length=kv_length, stats=True)
    qs, qp = q[:, : L - 6], positions[:, : L - 6]
    one, st1 = dense_attention(qs, k, v, qp, positions, enc, AttentionCall(**kw))
    split, st2 = dense_attention(qs, k, v, qp, positions, enc, AttentionCall(causal_block=3, **kw))
    _close((one, st1), (split, st2), rtol=1e-5, atol=1e-6)
    if kv_length == 0:
        assert float(jnp.abs(split).max()) == 0.0


def test_causal_mask_by_index_and_offset():
    """A query at index q_offset + i sees keys 0..q_offset + i and no later ones."""
    enc = _encoding("nope")
    q, k, v, positions, _ = _inputs(2)
    out = attention(q[:, :1], k, v, positions[:, 3:4], positions, enc,
                    AttentionCall(scale=0.5, q_offset=3, impl="dense"))
    ref = attention(q[:, :1], k[:, :4], v[:, :4], positions[:, 3:4], positions[:, :4], enc,
                    AttentionCall(scale=0.5, causal=False, impl="dense"))
    _close(out, ref, rtol=1e-5, atol=1e-6)


def test_unknown_impl_raises():
    enc = _encoding("nope")
    q, k, v, positions, _ = _inputs()
    with pytest.raises(ValueError, match="unknown attention_impl 'flash'.*auto, dense, blocked"):
        attention(q, k, v, positions, positions, enc, AttentionCall(scale=1.0, impl="flash"))


_MEMORY_SCRIPT = textwrap.dedent(
    """
    import resource, jax, jax.numpy as jnp
    from flax import nnx
    from posenc.model import Decoder
    from posenc.model.config import model_config
    c = model_config()
    c.d_model, c.num_layers, c.num_heads, c.vocab_size = 64, 2, 4, 256
    c.position.kind = "alibi"
    m = Decoder(c, rngs=nnx.Rngs(0))
    g, s = nnx.split(m)
    f = jax.jit(lambda s, t: nnx.merge(g, s)(t)[:, -1])
    out = f(s, jnp.zeros((1, 16384), jnp.int32))
    assert bool(jnp.isfinite(out).all())
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    """
)


@pytest.mark.slow
def test_evaluation_at_16k_tokens_fits_in_2gb():
    """Blocked attention never builds [H, L, L]: 16K tokens of a small model under 2 GB."""
    res = subprocess.run([sys.executable, "-c", _MEMORY_SCRIPT], capture_output=True, text=True,
                         timeout=600, check=True)
    peak_kb = int(res.stdout.strip().splitlines()[-1])
    assert peak_kb < 2 * 1024 * 1024, f"peak RSS {peak_kb / 1024:.0f} MB"


def test_attention_call_is_a_pytree_traced_offsets_leaves_options_static():
    """Offsets, kv_length and scale are leaves (traced under jit: one compile for every cache
    length); the span and the path are aux data (another value is another program)."""
    enc = _encoding("alibi")
    q, k, v, positions, _ = _inputs(4)
    call = AttentionCall(scale=0.5, q_offset=3, kv_length=9, window=4, impl="dense")
    leaves, tree = jax.tree.flatten(call)
    assert leaves == [0.5, 3, 9]
    assert jax.tree.unflatten(tree, leaves).window == 4
    assert jax.tree.structure(call.replace(window=2)) != tree
    assert jax.tree.structure(call.replace(q_offset=5)) == tree
    traced = []

    @jax.jit
    def run(call):
        traced.append(isinstance(call.q_offset, jax.core.Tracer))
        return attention(q[:, :4], k, v, positions[:, 3:7], positions, enc, call)

    want = attention(q[:, :4], k, v, positions[:, 3:7], positions, enc, call)
    _close(run(call), want, rtol=1e-6, atol=1e-6)
    _close(run(call.replace(q_offset=4, kv_length=10)),
           attention(q[:, :4], k, v, positions[:, 3:7], positions, enc,
                     call.replace(q_offset=4, kv_length=10)), rtol=1e-6, atol=1e-6)
    assert traced == [True]  # one trace for both offsets
    assert call.span == "window" and AttentionCall(scale=1.0, chunk=3).span == "chunk"
    assert AttentionCall(scale=1.0).span == "full"


@pytest.mark.parametrize("fields, message", [
    (dict(window=4, chunk=8), "a layer has one span: window=4 and chunk=8 are both set"),
    (dict(impl="flash"), "unknown attention_impl 'flash'"),
    (dict(block=0), "AttentionCall.block must be an int >= 1; got 0"),
    (dict(window=-1), "AttentionCall.window must be an int >= 0; got -1"),
    (dict(stats=1), "AttentionCall.stats must be a bool; got 1"),
])
def test_bad_attention_calls_raise(fields, message):
    with pytest.raises(ValueError, match=message):
        AttentionCall(scale=1.0, **fields)
