"""posenc.mla against a transcription of DeepSeek-V3's official MLA.

Reference (numpy float64, written from the official code): deepseek-ai/DeepSeek-V3 @ 013e221,
inference/model.py: ``precompute_freqs_cis`` (YaRN frequencies when max_seq_len > original_seq_len),
``apply_rotary_emb`` (complex pairs (2i, 2i + 1)), class ``MLA`` (``__init__``: softmax_scale with
mscale; ``forward`` with ``attn_impl`` "naive" (k_cache / v_cache of expanded keys and values) and
"absorb" (kv_cache of the normalised latent, pe_cache of the rotated key)). torch's Linear weight
[out, in] is ``w.T`` of posenc's [in, ...] layout.
"""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from posenc import mla, rope

RNG = np.random.default_rng(0)


# --- transcription of deepseek-ai/DeepSeek-V3 inference/model.py -------------------------------

def official_precompute_freqs_cis(dim, seqlen, base, factor, beta_fast, beta_slow, orig_seq_len):
    log_base = 2 * math.log(base)

    def correction_dim(rotations):
        return dim * (math.log(orig_seq_len / (rotations * 2 * math.pi)) / log_base)

    def correction_range(low_rot, high_rot):
        r = np.round(np.array([correction_dim(low_rot), correction_dim(high_rot)]))
        return np.clip(r, 0, dim - 1).astype(int)

    def linear_ramp(min_v, max_v, size):
        return np.clip((np.arange(size, dtype=np.float64) - min_v) / (max_v - min_v + 1e-3), 0, 1)

    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    if seqlen > orig_seq_len:
        low, high = correction_range(beta_fast, beta_slow)
        smooth = 1 - linear_ramp(low, high, dim // 2)
        freqs = freqs * (smooth + (1 - smooth) / factor)
    return freqs, np.exp(1j * np.outer(np.arange(seqlen), freqs))  # torch.polar(ones, angles)


def official_apply_rotary_emb(x, freqs_cis):
    """x [b, s, h, d] (pairs (2i, 2i+1) as complex numbers), freqs_cis [s, d/2]."""
    xc = x[..., 0::2] + 1j * x[..., 1::2]
    y = xc * freqs_cis[None, :, None, :]
    return np.stack([y.real, y.imag], axis=-1).reshape(x.shape)


def rms_norm(x, w, eps=1e-6):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def softmax(s):
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


class OfficialMLA:
    """class MLA with both attn_impl branches; weights in torch's [out, in] layout."""

    def __init__(self, w, *, n_heads, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim,
                 v_head_dim, max_seq_len, original_seq_len, rope_factor, mscale, max_batch_size, impl):
        self.w, self.h, self.q_lora_rank, self.kv_lora_rank = w, n_heads, q_lora_rank, kv_lora_rank
        self.nope, self.rope, self.v = qk_nope_head_dim, qk_rope_head_dim, v_head_dim
        self.softmax_scale = (qk_nope_head_dim + qk_rope_head_dim) ** -0.5
        if max_seq_len > original_seq_len:
            m = 0.1 * mscale * math.log(rope_factor) + 1.0
            self.softmax_scale *= m ** 2
        self.impl = impl
        if impl == "naive":
            self.k_cache = np.zeros((max_batch_size, max_seq_len, n_heads, self.nope + self.rope))
            self.v_cache = np.zeros((max_batch_size, max_seq_len, n_heads, v_head_dim))
        else:
            self.kv_cache = np.zeros((max_batch_size, max_seq_len, kv_lora_rank))
            self.pe_cache = np.zeros((max_batch_size, max_seq_len, qk_rope_head_dim))

    def forward(self, x, start_pos, freqs_cis, mask):
        w = self.w
        bsz, seqlen, _ = x.shape
        end_pos = start_pos + seqlen
        if self.q_lora_rank == 0:
            q = x @ w["wq"].T
        else:
            q = rms_norm(x @ w["wq_a"].T, w["q_norm"]) @ w["wq_b"].T
        q = q.reshape(bsz, seqlen, self.h, self.nope + self.rope)
        q_nope, q_pe = q[..., :self.nope], q[..., self.nope:]
        q_pe = official_apply_rotary_emb(q_pe, freqs_cis)
        kv = x @ w["wkv_a"].T
        kv, k_pe = kv[..., :self.kv_lora_rank], kv[..., self.kv_lora_rank:]
        k_pe = official_apply_rotary_emb(k_pe[:, :, None, :], freqs_cis)
        if self.impl == "naive":
            q = np.concatenate([q_nope, q_pe], axis=-1)
            kv = (rms_norm(kv, w["kv_norm"]) @ w["wkv_b"].T).reshape(bsz, seqlen, self.h, self.nope + self.v)
            k_nope, v = kv[..., :self.nope], kv[..., self.nope:]
            k = np.concatenate([k_nope, np.broadcast_to(k_pe, k_nope.shape[:3] + (self.rope,))], axis=-1)
            self.k_cache[:bsz, start_pos:end_pos] = k
            self.v_cache[:bsz, start_pos:end_pos] = v
            scores = np.einsum("bshd,bthd->bsht", q, self.k_cache[:bsz, :end_pos]) * self.softmax_scale
        else:
            wkv_b = w["wkv_b"].reshape(self.h, -1, self.kv_lora_rank)
            q_nope = np.einsum("bshd,hdc->bshc", q_nope, wkv_b[:, :self.nope])
            self.kv_cache[:bsz, start_pos:end_pos] = rms_norm(kv, w["kv_norm"])
            self.pe_cache[:bsz, start_pos:end_pos] = k_pe[:, :, 0]
            scores = (np.einsum("bshc,btc->bsht", q_nope, self.kv_cache[:bsz, :end_pos])
                      + np.einsum("bshr,btr->bsht", q_pe, self.pe_cache[:bsz, :end_pos])) * self.softmax_scale
        if mask is not None:
            scores = scores + mask[:, None, :]
        scores = softmax(scores)
        if self.impl == "naive":
            out = np.einsum("bsht,bthd->bshd", scores, self.v_cache[:bsz, :end_pos])
        else:
            out = np.einsum("bsht,btc->bshc", scores, self.kv_cache[:bsz, :end_pos])
            out = np.einsum("bshc,hdc->bshd", out, wkv_b[:, -self.v:])
        return out.reshape(bsz, seqlen, -1) @ w["wo"].T


# --- posenc side ----------------------------------------------------------------------------------

D, H, CQ, C, N, R, V = 16, 3, 6, 5, 4, 8, 3
# base and original length chosen so that the official round() of the correction range equals the
# floor / ceil of posenc (truncate=True, as Hugging Face): low 1, high 4 of the 4 pairs
ARGS = dict(base=500.0, factor=40.0, beta_fast=32.0, beta_slow=1.0, orig=2048, max_seq_len=4096)


def torch_weights(q_lora_rank):
    w = {"wkv_a": RNG.normal(size=(C + R, D)) / 4, "kv_norm": 1 + 0.1 * RNG.normal(size=C),
         "wkv_b": RNG.normal(size=(H * (N + V), C)) / 2, "wo": RNG.normal(size=(D, H * V)) / 2}
    if q_lora_rank:
        w.update(wq_a=RNG.normal(size=(q_lora_rank, D)) / 4, q_norm=1 + 0.1 * RNG.normal(size=q_lora_rank),
                 wq_b=RNG.normal(size=(H * (N + R), q_lora_rank)) / 2)
    else:
        w["wq"] = RNG.normal(size=(H * (N + R), D)) / 4
    return w


def ours(w):
    """posenc's layout: [in, heads, dim]."""
    f = lambda a: jnp.asarray(a, jnp.float32)  # noqa: E731
    out = {"wkv_a": f(w["wkv_a"].T), "kv_norm": f(w["kv_norm"]),
           "wkv_b": f(w["wkv_b"].T.reshape(C, H, N + V)), "wo": f(w["wo"].T.reshape(H, V, D))}
    if "wq" in w:
        out["wq"] = f(w["wq"].T.reshape(D, H, N + R))
    else:
        out.update(wq_a=f(w["wq_a"].T), q_norm=f(w["q_norm"]), wq_b=f(w["wq_b"].T.reshape(-1, H, N + R)))
    return out


def inv_freq():
    a = ARGS
    # mscale = mscale_all_dim: attention factor 1, as the official freqs_cis (its magnitude goes into
    # the softmax scale); truncate=True floors / ceils where the official code rounds (the same here)
    inv, factor = rope.frequencies("yarn", R, base=a["base"], factor=a["factor"], original_length=a["orig"],
                                   beta_fast=a["beta_fast"], beta_slow=a["beta_slow"], mscale=1.0,
                                   mscale_all_dim=1.0)
    assert float(factor) == 1.0
    return inv


def posenc_mla(p, x, positions, *, absorb, scale):
    """The full causal MLA of posenc.mla's pieces (RoPE interleaved on the rotary parts)."""
    kw = {"wq": p["wq"]} if "wq" in p else {k: p[k] for k in ("wq_a", "q_norm", "wq_b")}
    q_nope, q_pe = mla.queries(x, qk_nope_head_dim=N, **kw)
    c, k_pe = mla.latent(x, p["wkv_a"], p["kv_norm"])
    inv = inv_freq()
    q_pe = rope.apply(q_pe, positions, inv, layout="interleaved")
    k_pe = rope.apply(k_pe[..., None, :], positions, inv, layout="interleaved")[..., 0, :]
    if absorb:
        q_abs = mla.absorb_query(q_nope, p["wkv_b"], qk_nope_head_dim=N)
        s = mla.absorbed_scores(q_abs, q_pe, c, k_pe, scale=scale)
    else:
        k_nope, v = mla.expand(c, p["wkv_b"], qk_nope_head_dim=N)
        s = mla.explicit_scores(q_nope, q_pe, k_nope, k_pe, scale=scale)
    L = x.shape[-2]
    s = jnp.where(jnp.tril(jnp.ones((L, L), bool)), s, -jnp.inf)
    w = jnp.exp(s - s.max(-1, keepdims=True))
    w = w / w.sum(-1, keepdims=True)
    if absorb:
        o = mla.absorbed_output(jnp.einsum("bhqk,bkc->bqhc", w, c), p["wkv_b"], qk_nope_head_dim=N)
    else:
        o = jnp.einsum("bhqk,bkhv->bqhv", w, v)
    return jnp.einsum("bqhv,hvd->bqd", o, p["wo"])


def test_yarn_frequencies_match_precompute_freqs_cis():
    a = ARGS
    want, _ = official_precompute_freqs_cis(R, a["max_seq_len"], a["base"], a["factor"], a["beta_fast"],
                                            a["beta_slow"], a["orig"])
    # the official ramp divides by (high - low + 1e-3), Hugging Face's (and posenc's) by (high - low)
    np.testing.assert_allclose(np.asarray(inv_freq()), want, rtol=1e-3)


def test_softmax_scale_with_mscale():
    assert mla.softmax_scale(8) == pytest.approx(8 ** -0.5)
    m = 0.1 * 0.7 * math.log(40.0) + 1.0
    assert mla.softmax_scale(8, factor=40.0, mscale=0.7) == pytest.approx(8 ** -0.5 * m * m)
    assert mla.softmax_scale(8, factor=1.0, mscale=1.0) == pytest.approx(8 ** -0.5)  # no extension
    with pytest.raises(ValueError, match="qk_head_dim"):
        mla.softmax_scale(0)


@pytest.mark.parametrize("q_lora_rank", [0, CQ])
@pytest.mark.parametrize("impl", ["naive", "absorb"])
def test_matches_official_mla_prefill_and_decode(q_lora_rank, impl):
    a = ARGS
    B, L, P = 2, 7, 4  # prefill P tokens, then decode one at a time
    w = torch_weights(q_lora_rank)
    ref = OfficialMLA(w, n_heads=H, q_lora_rank=q_lora_rank, kv_lora_rank=C, qk_nope_head_dim=N,
                      qk_rope_head_dim=R, v_head_dim=V, max_seq_len=a["max_seq_len"], original_seq_len=a["orig"],
                      rope_factor=a["factor"], mscale=1.0, max_batch_size=B, impl=impl)
    _, freqs_cis = official_precompute_freqs_cis(R, a["max_seq_len"], a["base"], a["factor"], a["beta_fast"],
                                                 a["beta_slow"], a["orig"])
    x = RNG.normal(size=(B, L, D))
    mask = np.triu(np.full((P, P), -np.inf), 1)
    want = [ref.forward(x[:, :P], 0, freqs_cis[:P], mask)]
    want += [ref.forward(x[:, t:t + 1], t, freqs_cis[t:t + 1], None) for t in range(P, L)]
    want = np.concatenate(want, axis=1)
    scale = mla.softmax_scale(N + R, factor=a["factor"], mscale=1.0)
    assert scale == pytest.approx(ref.softmax_scale)
    got = posenc_mla(ours(w), jnp.asarray(x, jnp.float32), jnp.arange(L), absorb=impl == "absorb", scale=scale)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)


def test_absorbed_equals_explicit():
    p = ours(torch_weights(CQ))
    x = jnp.asarray(RNG.normal(size=(2, 5, D)), jnp.float32)
    a = posenc_mla(p, x, jnp.arange(5), absorb=True, scale=0.3)
    b = posenc_mla(p, x, jnp.arange(5), absorb=False, scale=0.3)
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
    keys = mla.absorbed_keys(jnp.ones((2, 5, C)), jnp.zeros((2, 5, R)))
    assert keys.shape == (2, 5, 1, C + R)


def test_bfloat16_in_bfloat16_out_and_query_arguments():
    p = ours(torch_weights(0))
    x = jnp.asarray(RNG.normal(size=(1, 3, D)), jnp.bfloat16)
    q_nope, q_pe = mla.queries(x, wq=p["wq"], qk_nope_head_dim=N)
    c, k_pe = mla.latent(x, p["wkv_a"], p["kv_norm"])
    assert q_nope.dtype == q_pe.dtype == c.dtype == k_pe.dtype == jnp.bfloat16
    assert q_nope.shape == (1, 3, H, N) and q_pe.shape == (1, 3, H, R) and c.shape == (1, 3, C)
    with pytest.raises(ValueError, match="either wq"):
        mla.queries(x, qk_nope_head_dim=N)
