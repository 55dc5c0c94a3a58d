"""posenc.kernels: fused Pallas attention with in-kernel position terms.

Runs the kernels in Pallas interpret mode on CPU against dense references
built from the pure modules (posenc.alibi / t5 / kerple / fire .bias) and,
for FoX, against the official test reference. Values and gradients of q, k,
v and of every term's arrays. Each kernel configuration is compiled once
(tiny shapes, several terms per compile); set POSENC_SLOW=1 for one
configuration per term and feature. Lowering to Triton and to Mosaic TPU is
checked by exporting for those platforms (no device needed).
"""

from __future__ import annotations

import os
import warnings

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from posenc import alibi, fire, hard_alibi, kerple, learned_sinks, t5
from posenc.kernels import flash_attention, score_term, supported, terms
from posenc.kernels import flash_kernels as fk

SLOW = os.environ.get("POSENC_SLOW") == "1"


# ---------------------------------------------------------------- references

def dense_reference(q, k, v, bias, *, scale, causal=True, q_offset=0, kv_length=None, window=None,
                    chunk=None, softcap=0.0, sinks=None):
    """Dense attention, float32, masks by index; a row with no visible key gives 0; ``sinks`` [H]:
    the softmax of posenc.learned_sinks (gpt-oss's sink column)."""
    B, Lq, H, _ = q.shape
    Lk, K = k.shape[1], k.shape[2]
    kr = jnp.repeat(k, H // K, axis=2).astype(jnp.float32)
    vr = jnp.repeat(v, H // K, axis=2).astype(jnp.float32)
    s = jnp.einsum("bqhd,bkhd->bhqk", q.astype(jnp.float32), kr,
                   precision=jax.lax.Precision.HIGHEST) * scale
    if bias is not None:
        s = s + bias
    if softcap:
        s = softcap * jnp.tanh(s / softcap)
    i = q_offset + jnp.arange(Lq)[:, None]
    j = jnp.arange(Lk)[None, :]
    mask = j < (Lk if kv_length is None else kv_length)
    if causal:
        mask &= j <= i
    if window is not None:
        mask &= j > i - window
    if chunk is not None:
        mask &= (i // chunk) == (j // chunk)
    s = jnp.where(mask, s, -jnp.inf)
    if sinks is not None:
        w = learned_sinks.softmax(s, sinks)
        return jnp.einsum("bhqk,bkhd->bqhd", w, vr, precision=jax.lax.Precision.HIGHEST)
    m = jax.lax.stop_gradient(jnp.max(s, -1, keepdims=True))
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    e = jnp.where(mask, jnp.exp(s - m), 0.0)
    l = e.sum(-1, keepdims=True)
    w = e / jnp.where(l > 0, l, 1.0)
    return jnp.einsum("bhqk,bkhd->bqhd", w, vr, precision=jax.lax.Precision.HIGHEST)


def fox_decay_bias(log_fgate, num_queries):
    """FoX bias, transcribed from zhixuan-lin/forgetting-transformer,
    src/forgetting_transformer/ops/forgetting_attention.py, ``test_op`` (reference part):

        log_lambda = torch.cumsum(log_fgate, dim=-1)
        decay_bias = log_lambda[..., -M:, None] - log_lambda[..., None, :]

    log_fgate [B, H, N] -> [B, H, M, N] (queries are the last M of the N keys).
    """
    log_lambda = jnp.cumsum(log_fgate, axis=-1)
    return log_lambda[..., -num_queries:, None] - log_lambda[..., None, :]


def _close(name, got, want, *, rtol, atol):
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    assert got.shape == want.shape, (name, got.shape, want.shape)
    assert np.all(np.isfinite(got)), name
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=name)


def _close_tree(got, want, *, rtol, atol):
    paths = jax.tree_util.tree_flatten_with_path(want)[0]
    for (path, w), g in zip(paths, jax.tree.leaves(got)):
        _close(jax.tree_util.keystr(path), g, w, rtol=rtol, atol=atol)


# NumPy draws: jax.random would compile a sampler per shape, seconds on 2 cores.
def _normal(seed, shape, scale=1.0):
    return jnp.asarray(np.random.default_rng(seed).normal(size=shape) * scale, jnp.float32)


def _uniform(seed, shape, lo, hi):
    return jnp.asarray(np.random.default_rng(seed).uniform(lo, hi, size=shape), jnp.float32)


def _fire_params(seed, H, hidden, legacy_threshold=None):
    """The layout and init ranges of posenc.fire.init_params (PyTorch nn.Linear default)."""
    b2 = 1.0 / np.sqrt(hidden)
    p = {"w1": _uniform(seed, (1, hidden), -1, 1), "b1": _uniform(seed + 1, (hidden,), -1, 1),
         "w2": _uniform(seed + 2, (hidden, H), -b2, b2), "b2": _uniform(seed + 3, (H,), -b2, b2),
         "c": jnp.float32(0.3)}
    if legacy_threshold is None:
        p["L_multiplier"] = jnp.float32(1.2)
    else:
        p["threshold"] = jnp.float32(legacy_threshold)
    return p


def _inputs(seed, B, Lq, Lk, H, K, D, dtype=jnp.float32):
    q = _normal(seed, (B, Lq, H, D)).astype(dtype)
    k = _normal(seed + 1, (B, Lk, K, D)).astype(dtype)
    v = _normal(seed + 2, (B, Lk, K, D)).astype(dtype)
    w = _normal(seed + 3, (B, Lq, H, D))  # cotangent of the output
    return q, k, v, w


def _value_and_grads(attn, w):
    """loss = sum(attn(q, k, v, params) * w); -> jitted (q, k, v, params, *scalars) -> (out, grads)."""
    def loss(q, k, v, params, *scalars):
        out = attn(q, k, v, params, *scalars)
        return jnp.sum(out.astype(jnp.float32) * w), out

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True))


# ---------------------------------------------------------------- per-term tiles (no kernel)

def test_term_tiles_equal_the_pure_biases():
    """score_term.dense(term) (the kernel's tile function on whole rows) == the pure module."""
    H = 3
    # distances up to ~300 and of both signs: every T5 bucket, FIRE's threshold, large KERPLE d
    qp = jnp.array([[0, 1, 2, 5, 9, 17, 40, 127, 128, 129, 200, 300]])
    kp = jnp.array([[0, 3, 7, 8, 16, 31, 64, 100, 150, 299]])
    a = _uniform(1, (H,), -0.5, 2.0)  # some below the clamp
    p = _uniform(2, (H,), 0.0, 2.5)  # some below and above the clamps
    table = _normal(3, (32, H))
    slopes = alibi.slopes(H)
    params = _fire_params(4, H, hidden=8)
    legacy = _fire_params(8, H, hidden=8, legacy_threshold=-30.0)
    c, ck = _normal(5, (2, H, 12)), _normal(6, (2, H, 10))
    windows = jnp.array([1, 40, 0])  # the last head has no window (NoPE)

    @jax.jit
    def both():
        cases = [
            (terms.alibi(slopes), alibi.bias(qp, kp, slopes)),
            (terms.alibi(slopes, causal=False), alibi.bias(qp, kp, slopes, causal=False)),
            (terms.t5(table), t5.bias(qp, kp, table)),
            (terms.t5(table, bidirectional=True, max_distance=64),
             t5.bias(qp, kp, table, bidirectional=True, max_distance=64)),
            (terms.kerple(a, p), kerple.bias(qp, kp, a, p)),
            (terms.kerple(a, p, kind="power"), kerple.bias(qp, kp, a, p, kind="power")),
            (terms.fire(params, init_L=40.0), fire.bias(qp, kp, params, init_L=40.0)),
            (terms.fire(legacy), fire.bias(qp, kp, legacy)),
            (terms.fox(c, ck), c[..., :, None] - ck[..., None, :]),
            (terms.hard_alibi(windows), hard_alibi.bias(qp, kp, windows)),
            (terms.hard_alibi(windows, causal=False), hard_alibi.bias(qp, kp, windows, causal=False)),
        ]
        return [(score_term.dense(t, qp, kp), want) for t, want in cases]

    names = ["alibi", "alibi", "t5", "t5", "kerple_log", "kerple_power", "fire", "fire", "fox",
             "hard_alibi", "hard_alibi"]
    for name, (got, want) in zip(names, both(), strict=True):
        if name == "hard_alibi":  # the pure -inf is the kernel's finite HIDDEN (terms must be finite)
            assert float(jnp.mean(jnp.isinf(want))) > 0.2
            np.testing.assert_array_equal(got, jnp.where(jnp.isinf(want), terms.HIDDEN, want))
        elif name == "t5":
            np.testing.assert_array_equal(got, want)  # bucket boundaries bit for bit
        else:
            _close(name, got, want, rtol=2e-6, atol=2e-6)


# ---------------------------------------------------------------- kernel vs dense

def _causal_params(H, Lk):
    return {
        "slopes": alibi.slopes(H),
        "table": _normal(10, (4, H)),
        "a": _uniform(11, (H,), 0.05, 1.0),
        "p": _uniform(12, (H,), 0.5, 1.5),
        "fire": _fire_params(13, H, hidden=2),
        "log_fgate": jax.nn.log_sigmoid(_uniform(17, (1, H, Lk), -1.0, 4.0)),
    }


def _causal_biases(P, qp, kp, Lq):
    return (alibi.bias(qp, kp, P["slopes"]) + t5.bias(qp, kp, P["table"], max_distance=6)
            + kerple.bias(qp, kp, P["a"], P["p"]) + fire.bias(qp, kp, P["fire"], init_L=10.0)
            + fox_decay_bias(P["log_fgate"], Lq))


def _causal_terms(P, Lq):
    c = jnp.cumsum(P["log_fgate"], axis=-1)
    return [terms.alibi(P["slopes"]), terms.t5(P["table"], max_distance=6),
            terms.kerple(P["a"], P["p"]), terms.fire(P["fire"], init_L=10.0),
            terms.fox(c[..., -Lq:], c)]


@pytest.mark.smoke
def test_all_causal_terms_gqa_softcap_window_traced_offset_and_kv_length():
    """ALiBi + T5 + KERPLE-log + FIRE + FoX summed in one kernel; GQA 4/2; Lq < Lk; softcap;
    window; q_offset and kv_length traced (one trace serves two (q_offset, kv_length) pairs)."""
    B, Lq, Lk, H, K, D = 1, 12, 20, 4, 2, 8
    q, k, v, w = _inputs(0, B, Lq, Lk, H, K, D)
    qp, kp = jnp.arange(Lk - Lq, Lk)[None], jnp.arange(Lk)[None]
    P = _causal_params(H, Lk)
    kw = dict(scale=0.35, softcap=4.0, window=7)

    @chex.assert_max_traces(n=1)
    def kernel(q, k, v, P, q_offset, kv_length):
        return flash_attention(q, k, v, q_positions=qp, k_positions=kp,
                               score_terms=_causal_terms(P, Lq), q_offset=q_offset,
                               kv_length=kv_length, block_q=8, block_k=8, interpret=True, **kw)

    def reference(q, k, v, P, q_offset, kv_length):
        return dense_reference(q, k, v, _causal_biases(P, qp, kp, Lq), q_offset=q_offset,
                               kv_length=kv_length, **kw)

    got_fn, want_fn = _value_and_grads(kernel, w), _value_and_grads(reference, w)
    for q_offset, kv_length in ((8, 18), (3, 20)):
        (_, got), g_got = got_fn(q, k, v, P, q_offset, kv_length)
        (_, want), g_want = want_fn(q, k, v, P, q_offset, kv_length)
        _close("out", got, want, rtol=1e-5, atol=1e-5)
        _close_tree(g_got, g_want, rtol=1e-4, atol=1e-5)
        for name in ("slopes", "table", "a", "p", "log_fgate"):  # every term is exercised
            assert float(jnp.abs(g_want[3][name]).max()) > 1e-3, name
        assert float(jnp.abs(g_want[3]["fire"]["w2"]).max()) > 1e-3


def test_bidirectional_terms_chunked_batch_positions():
    """Non-causal: ALiBi |i-j|, T5 bidirectional, KERPLE-power; chunk mask; per-batch positions;
    different query and key block sizes."""
    B, L, H, D = 2, 16, 2, 8
    q, k, v, w = _inputs(20, B, L, L, H, H, D)
    pos = jnp.stack([jnp.arange(L), jnp.arange(L) * 2 + 5])
    P = {"slopes": alibi.slopes(H), "table": _normal(24, (8, H)),
         "a": _uniform(25, (H,), 0.05, 1.0), "p": _uniform(26, (H,), 0.3, 1.8)}
    kw = dict(scale=0.3, causal=False, chunk=6)

    def kernel(q, k, v, P):
        ts = [terms.alibi(P["slopes"], causal=False),
              terms.t5(P["table"], bidirectional=True, max_distance=16),
              terms.kerple(P["a"], P["p"], kind="power")]
        return flash_attention(q, k, v, q_positions=pos, k_positions=pos, score_terms=ts,
                               block_q=8, block_k=16, interpret=True, **kw)

    def reference(q, k, v, P):
        bias = (alibi.bias(pos, pos, P["slopes"], causal=False)
                + t5.bias(pos, pos, P["table"], bidirectional=True, max_distance=16)
                + kerple.bias(pos, pos, P["a"], P["p"], kind="power"))
        return dense_reference(q, k, v, bias, **kw)

    (_, got), g_got = _value_and_grads(kernel, w)(q, k, v, P)
    (_, want), g_want = _value_and_grads(reference, w)(q, k, v, P)
    _close("out", got, want, rtol=1e-5, atol=1e-5)
    _close_tree(g_got, g_want, rtol=1e-4, atol=1e-5)


def test_bf16_gqa_window_chunk_and_rows_with_no_visible_key_tpu_interpreter():
    """bf16 q, k, v (float32 accumulation), 4 query heads on 1 kv head, window 3 + chunk 4 +
    kv_length 6 + q_offset 2: queries 6..11 see no key -> output exactly 0 and zero dq there.
    Runs the TPU block specs (scalars in SMEM) in Pallas' TPU interpreter, which simulates
    VMEM blocks and their copies to and from HBM."""
    B, Lq, Lk, H, K, D = 1, 12, 12, 4, 1, 16
    q, k, v, w = _inputs(30, B, Lq, Lk, H, K, D, jnp.bfloat16)
    qp, kp = jnp.arange(2, 2 + Lq)[None], jnp.arange(Lk)[None]
    lf = jax.nn.log_sigmoid(_uniform(34, (B, H, Lq + 2), 0.0, 3.0))  # gates of tokens 0..13
    P = {"slopes": alibi.slopes(H), "log_fgate": lf}
    kw = dict(scale=D ** -0.5, window=3, chunk=4)

    def kernel(q, k, v, P, q_offset, kv_length):
        c = jnp.cumsum(P["log_fgate"], -1)
        ts = [terms.alibi(P["slopes"]), terms.fox(c[..., 2:], c[..., :Lk])]
        return flash_attention(q, k, v, q_positions=qp, k_positions=kp, score_terms=ts,
                               q_offset=q_offset, kv_length=kv_length, block_q=8, block_k=8,
                               interpret=pltpu.InterpretParams(), backend="tpu", **kw)

    def reference(q, k, v, P, q_offset, kv_length):
        c = jnp.cumsum(P["log_fgate"], -1)
        bias = alibi.bias(qp, kp, P["slopes"]) + (c[..., 2:, None] - c[..., None, :Lk])
        return dense_reference(q, k, v, bias, q_offset=q_offset, kv_length=kv_length,
                               **kw).astype(jnp.bfloat16)

    (_, got), g_got = _value_and_grads(kernel, w)(q, k, v, P, 2, 6)
    (_, want), g_want = _value_and_grads(reference, w)(q, k, v, P, 2, 6)
    assert got.dtype == jnp.bfloat16 and g_got[0].dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(got[:, 6:], np.float32), 0.0)
    np.testing.assert_array_equal(np.asarray(g_got[0][:, 6:], np.float32), 0.0)
    assert float(jnp.abs(got[:, :6].astype(jnp.float32)).max()) > 0.1
    _close("out", got, want, rtol=2e-2, atol=2e-2)
    _close_tree(g_got, g_want, rtol=5e-2, atol=5e-2)


def test_learned_sinks_with_a_term_gqa_window_and_rows_with_no_visible_key():
    """gpt-oss sinks (posenc.learned_sinks) in the kernel: ALiBi term, 4 query heads on 2 kv heads,
    window 3, kv_length 9 with q_offset 4 (query i sits at key index 4 + i and sees keys
    2 + i .. 4 + i below 9: rows 7.. see none, output 0, all their mass on the sink). Values
    and the gradients of q, k, v, the slopes and the sinks equal the dense sink softmax's;
    sinks from -2 to 3 (one far above every logit)."""
    B, Lq, Lk, H, K, D = 1, 12, 12, 4, 2, 8
    q, k, v, w = _inputs(60, B, Lq, Lk, H, K, D)
    qp, kp = jnp.arange(4, 4 + Lq)[None], jnp.arange(Lk)[None]
    P = {"slopes": alibi.slopes(H), "sinks": jnp.array([-2.0, 0.0, 0.7, 3.0])}
    kw = dict(scale=D ** -0.5, window=3, q_offset=4, kv_length=9)

    def kernel(q, k, v, P):
        return flash_attention(q, k, v, q_positions=qp, k_positions=kp,
                               score_terms=[terms.alibi(P["slopes"])], sinks=P["sinks"],
                               block_q=8, block_k=8, interpret=True, **kw)

    def reference(q, k, v, P):
        return dense_reference(q, k, v, alibi.bias(qp, kp, P["slopes"]), sinks=P["sinks"], **kw)

    (_, got), g_got = _value_and_grads(kernel, w)(q, k, v, P)
    (_, want), g_want = _value_and_grads(reference, w)(q, k, v, P)
    _close("out", got, want, rtol=1e-5, atol=1e-5)
    _close_tree(g_got, g_want, rtol=1e-4, atol=1e-5)
    assert float(jnp.abs(g_want[3]["sinks"]).min()) > 1e-3
    np.testing.assert_array_equal(np.asarray(got[:, 7:]), 0.0)
    plain = flash_attention(q, k, v, q_positions=qp, k_positions=kp, block_q=8, block_k=8,
                            interpret=True, **kw)
    assert float(jnp.abs(plain - got).max()) > 1e-2  # the sinks take part


def test_nope_causal_under_vmap_and_grad():
    """No term (RoPE / NoPE): plain causal flash attention under vmap (one example per call),
    block_q != block_k; values and gradients equal the dense reference."""
    B, L, H, D = 2, 24, 2, 8
    q, k, v, w = _inputs(40, B, L, L, H, H, D)
    pos = jnp.arange(L)[None]

    def one(q, k, v):
        return flash_attention(q[None], k[None], v[None], q_positions=pos, k_positions=pos,
                               scale=0.4, block_q=16, block_k=8, interpret=True)[0]

    def kernel(q, k, v, _):
        return jax.vmap(one)(q, k, v)

    def reference(q, k, v, _):
        return dense_reference(q, k, v, None, scale=0.4)

    (_, got), g_got = _value_and_grads(kernel, w)(q, k, v, ())
    (_, want), g_want = _value_and_grads(reference, w)(q, k, v, ())
    _close("out", got, want, rtol=1e-5, atol=1e-5)
    _close_tree(g_got, g_want, rtol=1e-4, atol=1e-5)


def test_values_narrower_than_queries_and_keys():
    """v [.., Dv] with Dv < Dh of q and k (PoPE's polar q, k): the kernel zero-pads v and returns
    [.., Dv]; values and gradients equal the dense reference. GQA 4/2, a causal term."""
    B, L, H, K, D, Dv = 1, 12, 4, 2, 12, 5
    q, k, v, _ = _inputs(50, B, L, L, H, K, D)
    v, w = v[..., :Dv], _normal(54, (B, L, H, Dv))
    pos = jnp.arange(L)[None]
    windows = jnp.array([1, 3, 0, 0])

    def kernel(q, k, v, _):
        return flash_attention(q, k, v, q_positions=pos, k_positions=pos, scale=0.3, block_q=8,
                               block_k=8, score_terms=terms.hard_alibi(windows), interpret=True)

    def reference(q, k, v, _):
        return dense_reference(q, k, v, hard_alibi.bias(pos, pos, windows), scale=0.3)

    (_, got), g_got = _value_and_grads(kernel, w)(q, k, v, ())
    (_, want), g_want = _value_and_grads(reference, w)(q, k, v, ())
    assert got.shape == (B, L, H, Dv)
    _close("out", got, want, rtol=1e-5, atol=1e-5)
    _close_tree(g_got, g_want, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------- loop bounds skip blocks

def _brute_visible(cfg, q_offset, kv_len, lq, lk):
    i = q_offset + np.arange(lq)[:, None]
    j = np.arange(lk)[None, :]
    m = np.broadcast_to(j < kv_len, (lq, lk))
    if cfg.causal:
        m = m & (j <= i)
    if cfg.window is not None:
        m = m & (j > i - cfg.window)
    if cfg.chunk is not None:
        m = m & ((i // cfg.chunk) == (j // cfg.chunk))
    return m


BOUND_CASES = [(True, None, None), (True, 5, None), (True, None, 8), (False, None, 8),
               (True, 3, 4), (False, 7, None)]


def test_loop_bounds_visit_exactly_the_visible_blocks():
    """kv_block_range / q_block_range: every block with a visible (query, key) pair is in
    the loop range, and the first and last blocks of the range hold one (so the fully
    masked blocks before and after are skipped by the bounds, not only masked)."""
    bq, bk, nq, nk = 4, 8, 5, 4
    cfgs = [fk.Config(scale=1.0, causal=c, window=w, chunk=ch, softcap=0.0, block_q=bq,
                      block_k=bk, groups=1, batch_pos=False, terms=(), interpret=True,
                      backend=None) for c, w, ch in BOUND_CASES]
    offsets, lengths = np.meshgrid(np.arange(0, 14), np.arange(0, nk * bk + 1, 3))
    offsets, lengths = offsets.ravel().astype(np.int32), lengths.ravel().astype(np.int32)

    @jax.jit
    @jax.vmap
    def ranges(q_offset, kv_len):
        out = []
        for cfg in cfgs:
            kv = [jnp.stack(fk.kv_block_range(cfg, q_offset + qi * bq, kv_len, nk))
                  for qi in range(nq)]
            qr = [jnp.stack(fk.q_block_range(cfg, kj * bk, q_offset, kv_len, nq))
                  for kj in range(nk)]
            out.append((jnp.stack(kv), jnp.stack(qr)))
        return out

    for cfg, (kv_all, q_all) in zip(cfgs, ranges(offsets, lengths)):
        kv_all, q_all = np.asarray(kv_all), np.asarray(q_all)
        for n, (off, kl) in enumerate(zip(offsets, lengths)):
            vis = _brute_visible(cfg, int(off), int(kl), nq * bq, nk * bk)
            blocks = vis.reshape(nq, bq, nk, bk).any(axis=(1, 3))  # [nq, nk]
            where = (cfg.causal, cfg.window, cfg.chunk, int(off), int(kl))
            for ranges_, need in ((kv_all[n], blocks), (q_all[n], blocks.T)):
                for row, (lo, hi) in enumerate(ranges_):
                    needed = np.flatnonzero(need[row])
                    assert all(lo <= j < hi for j in needed), (where, row, lo, hi, needed)
                    if needed.size:
                        assert need[row, lo] and need[row, hi - 1], (where, row, lo, hi, needed)


# ---------------------------------------------------------------- supported / errors

def test_supported_says_why_not():
    assert supported((2, 64, 8, 64), (2, 64, 2, 64), interpret=True) == (True, "")
    ok, why = supported((2, 64, 8, 64), (2, 64, 3, 64), interpret=True)
    assert not ok and "multiple of num_kv_heads" in why
    ok, why = supported((2, 64, 8, 64), (2, 64, 2, 64), dtype=jnp.float16, interpret=True)
    assert not ok and "float16" in why
    assert supported((1, 4096, 8, 128), (1, 4096, 8, 128), backend="tpu", interpret=False)[0]
    ok, why = supported((1, 65536, 8, 128), (1, 65536, 8, 128), backend="tpu", interpret=False)
    assert not ok and "VMEM" in why
    # Blocks as Mosaic pads them (Dh 64 -> 128 lanes) against v5e's 16 MiB (the default when
    # no TPU is targeted): ALiBi with 16 kv heads at 16K and GQA 16/4 at 6K (dk/dv) fail to
    # compile there (tests/test_tpu_compile.py); v6e's 32 MiB takes the first.
    tpu = dict(dtype=jnp.bfloat16, score_terms=terms.alibi(jnp.ones(16)), backend="tpu",
               interpret=False)
    v5e, v6e = 16 * 2 ** 20, 32 * 2 ** 20
    if jax.default_backend() != "tpu":  # no TPU targeted: v5e's budget
        why = supported((1, 16384, 16, 64), (1, 16384, 16, 64), **tpu)[1]
        assert why.endswith("(TPU of unknown generation: v5e's)"), why
    ok, why = supported((1, 16384, 16, 64), (1, 16384, 16, 64), tpu_vmem_bytes=v5e, **tpu)
    assert not ok and "VMEM" in why and f"> {v5e} bytes" in why, why
    assert supported((1, 16384, 16, 64), (1, 16384, 16, 64), tpu_vmem_bytes=v6e, **tpu)[0]
    ok, why = supported((1, 6144, 16, 64), (1, 6144, 4, 64), tpu_vmem_bytes=v5e, **tpu)
    assert not ok and "dk/dv kernel" in why, why
    assert supported((1, 14848, 16, 64), (1, 14848, 16, 64), tpu_vmem_bytes=v5e, **tpu)[0]
    ok, why = supported((1, 64, 8, 64), (1, 64, 8, 64), block_q=48, interpret=True)
    assert not ok and "power of two" in why


def test_interpret_is_the_default_on_cpu_only():
    from posenc.kernels import resolve_backend
    assert jax.default_backend() != "cpu" or resolve_backend() == (None, True)
    assert resolve_backend("gpu", False) == ("gpu", False)
    with pytest.raises(ValueError, match="backend"):
        resolve_backend("cuda")


def test_bad_arguments_raise_value_errors():
    q, k, v, _ = _inputs(0, 1, 8, 8, 2, 1, 8)
    pos = jnp.arange(8)[None]
    kw = dict(q_positions=pos, k_positions=pos, scale=0.5, interpret=True)
    cases = [
        (dict(block_q=12), "power of two"),
        (dict(window=0), "window"),
        (dict(q_offset=-1), "q_offset"),
        (dict(kv_length=9), "kv_length"),
        (dict(softcap=-1.0), "softcap"),
        (dict(q_positions=pos.astype(jnp.float32)), "integer"),
        (dict(score_terms=[terms.alibi(jnp.ones(3))]), "head arrays need 2 rows"),
        (dict(score_terms=["alibi"]), "score_terms"),
        (dict(backend="cuda"), "backend"),
    ]
    for extra, match in cases:
        with pytest.raises(ValueError, match=match):
            flash_attention(q, k, v, **{**kw, **extra})
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        flash_attention(q, k[:, :, :1].repeat(3, 2), v[:, :, :1].repeat(3, 2), **kw)
    with pytest.raises(ValueError, match="static float"):
        jax.jit(lambda s: flash_attention(q, k, v, **{**kw, "scale": s}))(0.5)
    with pytest.raises(ValueError, match="kind"):
        terms.kerple(jnp.ones(2), jnp.ones(2), kind="exp")
    with pytest.raises(ValueError, match="max_distance"):
        terms.t5(jnp.zeros((8, 2)), max_distance=4)


# ---------------------------------------------------------------- lowering (no device)

def _export(platform, dtype=jnp.bfloat16):
    """StableHLO text of the jitted gradient (forward, dq, dk/dv kernels; every term, GQA,
    softcap, window, chunk, learned sinks) for "cuda" (an abstract H100) or "tpu", at the default blocks.
    Also used by test_triton_compile.py, which compiles its Triton kernels to cubins."""
    from jax import export
    from jax._src.mesh import AbstractDevice, AbstractMesh

    from posenc.kernels.flash import DEFAULT_BLOCKS

    B, L, H, K, D = 1, 256, 4, 2, 64
    bq, bk = DEFAULT_BLOCKS["gpu" if platform == "cuda" else "tpu"]  # 64 / 128, below L
    qs = jax.ShapeDtypeStruct((B, L, H, D), dtype)
    ks = jax.ShapeDtypeStruct((B, L, K, D), dtype)
    lf = jax.ShapeDtypeStruct((B, H, L), jnp.float32)
    pos = jnp.arange(L)[None]
    P = _causal_params(H, L)

    def loss(q, k, v, lf, q_offset):
        P2 = {**P, "log_fgate": lf}
        o = flash_attention(q, k, v, q_positions=pos, k_positions=pos,
                            score_terms=_causal_terms(P2, L), scale=D ** -0.5, q_offset=q_offset,
                            softcap=30.0, window=200, chunk=128, sinks=jnp.linspace(-1.0, 1.0, H),
                            block_q=bq, block_k=bk, interpret=False, backend="gpu" if platform == "cuda" else "tpu")
        return o.astype(jnp.float32).sum()

    fn = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))
    kind, gpu = ("NVIDIA H100", "gpu") if platform == "cuda" else ("TPU v5 lite", "tpu")
    mesh = AbstractMesh((1,), ("x",), (jax.sharding.AxisType.Auto,),
                        abstract_device=AbstractDevice(device_kind=kind, num_cores=1, platform=gpu))
    checks = [export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")]
    with jax.sharding.use_abstract_mesh(mesh), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the Pallas Triton backend notice
        exp = export.export(fn, platforms=[platform], disabled_checks=checks)(
            qs, ks, ks, lf, jax.ShapeDtypeStruct((), jnp.int32))
    return exp.mlir_module()


@pytest.mark.parametrize("platform,target", [("cuda", "__gpu$xla.gpu.triton"),
                                             ("tpu", "tpu_custom_call")])
@pytest.mark.smoke
def test_kernels_lower_for_triton_and_mosaic_tpu(platform, target):
    """Forward, dq and dk/dv kernels with every term lower to Triton / Mosaic custom calls."""
    text = _export(platform)
    assert text.count(f"@{target}") == 3 if platform == "cuda" else text.count(target) >= 3
    for name in ("posenc_flash_fwd", "posenc_flash_dq", "posenc_flash_dkv"):
        assert name in text, name


# ---------------------------------------------------------------- slow profile

SLOW_TERMS = ["alibi", "t5", "t5_bidir", "kerple_log", "kerple_power", "fire", "fox"]


@pytest.mark.skipif(not SLOW, reason="set POSENC_SLOW=1")
@pytest.mark.parametrize("name", SLOW_TERMS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_slow_each_term_alone(name, dtype):
    """One term per kernel, default hyper-parameters (32 buckets, FIRE hidden 32), GQA,
    softcap, Lq < Lk with an offset, kv_length < Lk, window."""
    B, Lq, Lk, H, K, D = 2, 40, 72, 4, 2, 16
    q, k, v, w = _inputs(11, B, Lq, Lk, H, K, D, dtype)
    qp = jnp.arange(Lk - Lq, Lk)[None] * 3  # stride 3: distances up to ~200
    kp = jnp.arange(Lk)[None] * 3
    causal = name != "t5_bidir"
    kp_ = (_uniform(50, (H,), 0.0, 1.0), _uniform(51, (H,), 0.5, 1.5))
    P = {
        "alibi": alibi.slopes(H), "t5": _normal(52, (32, H)), "t5_bidir": _normal(52, (32, H)),
        "kerple_log": kp_, "kerple_power": kp_, "fire": fire.init_params(jax.random.key(0), H),
        "fox": jax.nn.log_sigmoid(_normal(53, (B, H, Lk)) + 2.0),
    }[name]

    def make(P):
        if name == "alibi":
            return terms.alibi(P), alibi.bias(qp, kp, P)
        if name in ("t5", "t5_bidir"):
            return terms.t5(P, bidirectional=not causal), t5.bias(qp, kp, P, bidirectional=not causal)
        if name.startswith("kerple"):
            kind = name.split("_")[1]
            return terms.kerple(*P, kind=kind), kerple.bias(qp, kp, *P, kind=kind)
        if name == "fire":
            return terms.fire(P, init_L=64.0), fire.bias(qp, kp, P, init_L=64.0)
        c = jnp.cumsum(P, -1)
        return terms.fox(c[..., -Lq:], c), fox_decay_bias(P, Lq)

    kw = dict(scale=D ** -0.5, causal=causal, q_offset=Lk - Lq, kv_length=Lk - 5, window=50,
              softcap=3.0)

    def kernel(q, k, v, P):
        return flash_attention(q, k, v, q_positions=qp, k_positions=kp, score_terms=make(P)[0],
                               block_q=16, block_k=16, interpret=True, **kw)

    def reference(q, k, v, P):
        return dense_reference(q, k, v, make(P)[1], **kw).astype(dtype)

    (_, got), g_got = _value_and_grads(kernel, w)(q, k, v, P)
    (_, want), g_want = _value_and_grads(reference, w)(q, k, v, P)
    tol = 1e-4 if dtype == jnp.float32 else 6e-2
    _close("out", got, want, rtol=tol, atol=tol)
    _close_tree(g_got, g_want, rtol=tol * 2, atol=tol * 2)


# ---------------------------------------------------------------- compiled kernels (GPU / TPU)

@pytest.mark.accelerator
@pytest.mark.skipif(jax.default_backend() == "cpu", reason="needs a GPU or TPU")
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_accelerator_compiled_kernels_equal_the_dense_reference(dtype):
    """Every causal term in one compiled kernel (Triton / Mosaic) at block-sized shapes, GQA 8/2,
    Lq < Lk, softcap, window, traced q_offset: values and gradients vs the float32 reference,
    relative to each array's scale (float32 dots may run as TF32 on GPU). Term-array
    gradients sum ds over every (query, key) pair, with bf16 probabilities in the forward's
    p @ v: FIRE's output bias is within 6% in the interpreter, hence 0.1 for bf16."""
    B, Lq, Lk, H, K, D = 2, 384, 512, 8, 2, 64
    q, k, v, w = _inputs(60, B, Lq, Lk, H, K, D, dtype)
    qp, kp = jnp.arange(Lk - Lq, Lk)[None], jnp.arange(Lk)[None]
    P = _causal_params(H, Lk)
    kw = dict(scale=D ** -0.5, softcap=20.0, window=300)

    def kernel(q, k, v, P, q_offset):
        return flash_attention(q, k, v, q_positions=qp, k_positions=kp,
                               score_terms=_causal_terms(P, Lq), q_offset=q_offset,
                               interpret=False, **kw)

    def reference(q, k, v, P, q_offset):
        return dense_reference(q, k, v, _causal_biases(P, qp, kp, Lq), q_offset=q_offset,
                               **kw).astype(dtype)

    (_, got), g_got = _value_and_grads(kernel, w)(q, k, v, P, Lk - Lq)
    (_, want), g_want = _value_and_grads(reference, w)(q, k, v, P, Lk - Lq)
    bf16 = dtype == jnp.bfloat16
    leaves = [("out", got, want)] + [
        (jax.tree_util.keystr(path), g, x) for (path, x), g in
        zip(jax.tree_util.tree_flatten_with_path(g_want)[0], jax.tree.leaves(g_got))]
    for n, (name, g, x) in enumerate(leaves):
        g, x = np.asarray(g, np.float32), np.asarray(x, np.float32)
        tol = (0.1 if n > 3 else 4e-2) if bf16 else 2e-2  # out, dq, dk, dv come first
        assert np.all(np.isfinite(g)), name
        assert np.abs(g - x).max() <= tol * np.abs(x).max() + 1e-5, (name, np.abs(g - x).max())
