"""Stick-breaking attention: sigmoid shares of what the closer keys left, instead of a softmax."""

import jax
import jax.numpy as jnp

from posenc.attention import stickbreaking as sb
from posenc.checks import boolean
from posenc.model import attention as attn_lib
from posenc.model.encoding import Encoding
from posenc.model.options import Option
from posenc.model.registry import register_encoding
from posenc.norms import norms


@register_encoding("stickbreaking")
class StickBreaking(Encoding):
    """A_ij = sigmoid(z_ij) prod_{j<k<i} (1 - sigmoid(z_ik)); the rest 1 - sum_j A_ij to v_i.

    ``posenc.stickbreaking`` (shawntan/stickbreaking-attention, ``sb_ref.py`` /
    ``ref_fwd``): no softmax, no position encoding. The blocked path walks key
    blocks from the diagonal backwards carrying the log of the remaining
    stick; decoding reads the cache with the queries at ``q_offset + i``
    (slots after them are masked by causality). Without the causal mask
    every key is visible, broken from the last key backwards (as if the
    query came after every key).
    """

    relative = True
    paper = "Tan et al. 2025"
    pure = "posenc.attention.stickbreaking"
    spans = ("full",)
    attend_current = Option(False, boolean, "include the diagonal (j <= i); False: keys j < i "
                                            "(the official default)")

    def attention(self, q, k, v, q_positions, k_positions, call):
        lq, lk = q.shape[1], k.shape[1]
        scale, softcap, block, return_stats = call.scale, call.softcap, call.block, call.stats
        if not call.causal:
            return self._all_keys(q, k, v, scale, softcap, call.kv_length, return_stats)
        offset = call.q_offset if call.reads_cache(lq, lk) else 0
        blocked = call.runs_blocked(lq, lk)
        if return_stats or softcap:  # z computed here (capped): query blocks against every key
            return self._rows(q, k, v, scale, softcap, offset, block if blocked and not return_stats
                              else lq, return_stats)
        kw = dict(scale=scale, attend_current=self.attend_current, q_offset=offset)
        if blocked:
            return sb.blocked_attention(q, k, v, block=block, **kw)
        return sb.attention(q, k, v, **kw)

    def _logits(self, q, k, scale, softcap):
        kr = jnp.repeat(k, q.shape[2] // k.shape[2], axis=2)
        z = jnp.einsum("bqhd,bkhd->bhqk", q, kr, preferred_element_type=jnp.float32) * scale
        return norms.softcap(z, softcap) if softcap else z

    def _rows(self, q, k, v, scale, softcap, offset, bq, return_stats):
        """Blocks of ``bq`` queries, each against every key (memory O(bq Lk)); logits soft-capped."""
        B, lq, H, Dh = q.shape
        vr = jnp.repeat(v, H // v.shape[2], axis=2).astype(jnp.float32)
        n = -(-lq // bq)
        v_pad = jnp.pad(vr, ((0, 0), (0, bq), (0, 0), (0, 0)))  # own values of padded queries

        def rows(i, q_i):
            start = offset + i * bq
            z = self._logits(q_i, k, scale, softcap)
            log_a = sb.log_weights(z, attend_current=self.attend_current, q_offset=start)
            a = jnp.exp(log_a)
            rest = 1.0 - a.sum(-1)  # [B, H, bq]: the query's own value takes it
            own = jax.lax.dynamic_slice_in_dim(v_pad, start, q_i.shape[1], axis=1)
            out = jnp.einsum("bhqk,bkhd->bqhd", a, vr) + jnp.swapaxes(rest, 1, 2)[..., None] * own
            return out, (z, a, log_a, rest)

        if n == 1:
            out, (z, a, log_a, rest) = rows(0, q)
            out = out.astype(q.dtype)
            if not return_stats:
                return out
            return out, attn_lib.weight_stats(z, a, jnp.isfinite(log_a), rest=rest)
        qb = jnp.pad(q, ((0, 0), (0, n * bq - lq), (0, 0), (0, 0)))
        qb = jnp.moveaxis(qb.reshape((B, n, bq, H, Dh)), 1, 0)
        out = jax.lax.map(jax.checkpoint(lambda xs: rows(*xs)[0]), (jnp.arange(n), qb))
        return jnp.moveaxis(out, 0, 1).reshape((B, n * bq, H, Dh))[:, :lq].astype(q.dtype)

    def _all_keys(self, q, k, v, scale, softcap, kv_length, return_stats):
        """No causal mask: each query weighs every valid key, the stick broken from the last one."""
        lk = k.shape[1]
        valid = jnp.arange(lk) < (lk if kv_length is None else kv_length)
        z = jnp.where(valid, self._logits(q, k, scale, softcap), -1e30)  # unused slots: sigmoid 0
        # Each query row as a query sitting after every key (index lk - 1, diagonal included).
        log_a = sb.log_weights(z[..., None, :], attend_current=True, q_offset=lk - 1)[..., 0, :]
        a = jnp.exp(log_a)
        vr = jnp.repeat(v, q.shape[2] // v.shape[2], axis=2).astype(jnp.float32)
        rest = 1.0 - a.sum(-1)  # [B, H, Lq]
        own = vr[:, : q.shape[1]]
        out = jnp.einsum("bhqk,bkhd->bqhd", a, vr) + jnp.swapaxes(rest, 1, 2)[..., None] * own
        out = out.astype(q.dtype)
        if not return_stats:
            return out
        return out, attn_lib.weight_stats(z, a, valid, rest=rest)
