"""Attention alone, forward + backward: the fused Pallas kernel against jax's own attention.

    python benchmarks/attention_op.py --batch 16 --seq 2048 --heads 16 --head_dim 64

One JSON line per implementation: ``posenc.kernels.flash_attention`` with no
term (RoPE / NoPE) and with ALiBi's, at several (block_q, block_k);
``jax.nn.dot_product_attention`` with implementation "cudnn" (GPU only) and
"xla" (materialised logits). bf16 q, k, v; causal. ``tflops`` counts the
causal FLOPs as FlashAttention's benchmarks do: forward 2 B H L^2 Dh (half of
the 4 B H L^2 Dh of full attention), backward 2.5 times the forward.
``--dry_run``: tiny shapes, the Pallas interpreter on CPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def _args(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head_dim", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--blocks", default="64x64,128x64,64x128,128x128")
    ap.add_argument("--dry_run", action="store_true")
    return ap.parse_args(argv)


def main(argv=None):
    a = _args(argv)
    import jax
    import jax.numpy as jnp

    from posenc.encodings import alibi
    from posenc.kernels import flash_attention, terms

    if a.dry_run:
        a.batch, a.seq, a.heads, a.head_dim, a.repeats, a.blocks = 1, 64, 2, 16, 1, "16x16"
    B, L, H, D = a.batch, a.seq, a.heads, a.head_dim
    keys = jax.random.split(jax.random.key(0), 4)
    q, k, v, w = (jax.random.normal(kk, (B, L, H, D), jnp.bfloat16) for kk in keys)
    pos = jnp.arange(L)[None]
    flops = 3.5 * 2 * B * H * L * L * D  # causal forward 2 B H L^2 D; backward 2.5x
    platform = jax.default_backend()

    def timed(name, attn, **info):
        def loss(q, k, v):
            return jnp.sum(attn(q, k, v).astype(jnp.float32) * w.astype(jnp.float32))

        step = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
        row = dict(op="attention fwd+bwd", impl=name, batch=B, seq=L, heads=H, head_dim=D,
                   platform=platform, **info)
        try:
            t = time.perf_counter()
            jax.block_until_ready(step(q, k, v))
            row["compile_s"] = round(time.perf_counter() - t, 2)
            times = []
            for _ in range(a.repeats):
                t = time.perf_counter()
                jax.block_until_ready(step(q, k, v))
                times.append(time.perf_counter() - t)
            med = statistics.median(times)
            row.update(time_ms=round(1e3 * med, 3), tflops=round(flops / med / 1e12, 2))
        except Exception as e:  # an implementation this machine lacks (cuDNN) is a row, not a stop
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        print(json.dumps(row), flush=True)

    slopes = alibi.slopes(H)
    for blocks in a.blocks.split(","):
        bq, bk = (int(x) for x in blocks.split("x"))
        for term in ("none",) if a.dry_run else ("none", "alibi"):
            score_terms = () if term == "none" else (terms.alibi(slopes),)
            timed("pallas", lambda q, k, v, st=score_terms, bq=bq, bk=bk: flash_attention(
                q, k, v, q_positions=pos, k_positions=pos, score_terms=st, scale=D ** -0.5,
                block_q=bq, block_k=bk), term=term, block_q=bq, block_k=bk)
    impls = ("xla",) if a.dry_run or platform != "gpu" else ("cudnn", "xla")
    for impl in impls:
        timed(impl, lambda q, k, v, impl=impl: jax.nn.dot_product_attention(
            q, k, v, is_causal=True, scale=D ** -0.5, implementation=impl), term="none")


if __name__ == "__main__":
    main()
