"""PyTorch peer for the accelerator check: train and eval throughput of the same decoder.

Extends the project's CPU peer (../shared/bench/xt_bench.py: x-transformers,
same flags, same JSON line) to a GPU: bf16 autocast, the device's memory
peak, and two attention implementations:

    --impl xt     x-transformers' Decoder; attn_flash=True (torch SDPA) except
                  for T5, which x-transformers does not allow with it (its own
                  einsum attention on the materialised bias). With RoPE SDPA
                  runs the flash kernel; with ALiBi the bias is built and
                  passed to SDPA as an additive mask
    --impl flex   a plain pre-LayerNorm GELU decoder (the same shapes) whose
                  attention is torch FlexAttention with the ALiBi (or no) term
                  as a score_mod and a causal block mask, torch.compile'd

usage: python torch_peer.py --impl xt --pe rotary --dim 1024 --depth 12 --heads 16 --batch 16 \\
           --seq 2048 --vocab 256 --steps 10 --warmup 3 [--eval-seq 32768] [--device cuda]
Prints one JSON line: pe, impl, step_s, train_tok_s (median of timed steps), loss,
eval_s / eval_tok_s at --eval-seq (one timed forward after one warm-up), peak_mem_mb.
"""

import argparse
import json
import math
import resource
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn


def _args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--impl", default="xt", choices=("xt", "flex"))
    ap.add_argument("--pe", default="rotary", choices=("rotary", "alibi", "t5", "none"))
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--eval-seq", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    ap.add_argument("--compile", type=int, default=-1, help="torch.compile flex (-1: on CUDA only)")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads (CPU runs only)")
    ap.add_argument("--flash", type=int, default=-1, help="xt attn_flash (-1: on, except t5)")
    return ap.parse_args()


def _xt_model(a):
    from x_transformers import Decoder, TransformerWrapper

    pe = {"rotary": dict(rotary_pos_emb=True), "alibi": dict(alibi_pos_bias=True),
          "t5": dict(rel_pos_bias=True), "none": {}}[a.pe]
    flash = a.pe != "t5" if a.flash < 0 else bool(a.flash)
    return TransformerWrapper(num_tokens=a.vocab, max_seq_len=a.seq, use_abs_pos_emb=False,
                              attn_layers=Decoder(dim=a.dim, depth=a.depth, heads=a.heads,
                                                  attn_flash=flash, **pe))


def _alibi_slopes(h):
    """Press et al.'s geometric slopes (x-transformers / posenc.alibi.slopes for powers of two)."""
    def pow2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start ** i for i in range(n)]
    if math.log2(h).is_integer():
        return pow2(h)
    c = 2 ** math.floor(math.log2(h))
    return pow2(c) + pow2(2 * c)[0::2][:h - c]


class _FlexDecoder(nn.Module):
    """Pre-LN decoder: LayerNorm, q/k/v/out projections, FlexAttention, GELU MLP x4, untied head."""

    def __init__(self, a, attend):
        super().__init__()
        self.heads, self.attend = a.heads, attend
        self.embed = nn.Embedding(a.vocab, a.dim)
        self.layers = nn.ModuleList(nn.ModuleDict(dict(
            ln1=nn.LayerNorm(a.dim), qkv=nn.Linear(a.dim, 3 * a.dim, bias=False),
            out=nn.Linear(a.dim, a.dim, bias=False), ln2=nn.LayerNorm(a.dim),
            ff=nn.Sequential(nn.Linear(a.dim, 4 * a.dim), nn.GELU(), nn.Linear(4 * a.dim, a.dim)),
        )) for _ in range(a.depth))
        self.norm = nn.LayerNorm(a.dim)
        self.head = nn.Linear(a.dim, a.vocab, bias=False)

    def forward(self, x):
        h = self.embed(x)
        B, L, D = h.shape
        for layer in self.layers:
            q, k, v = layer["qkv"](layer["ln1"](h)).view(B, L, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
            o = self.attend(q, k, v, L)
            h = h + layer["out"](o.transpose(1, 2).reshape(B, L, D))
            h = h + layer["ff"](layer["ln2"](h))
        return self.head(self.norm(h))


def _flex_model(a):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if a.pe not in ("alibi", "none"):
        raise SystemExit(f"--impl flex supports --pe alibi and none, not {a.pe}")
    compile_ = a.compile if a.compile >= 0 else int(a.device.startswith("cuda"))
    flex = torch.compile(flex_attention, dynamic=False) if compile_ else flex_attention
    slopes = torch.tensor(_alibi_slopes(a.heads), device=a.device, dtype=torch.float32)
    masks = {}

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    def alibi(score, b, h, q_idx, kv_idx):
        return score - slopes[h] * (q_idx - kv_idx)

    def attend(q, k, v, length):
        if length not in masks:
            masks[length] = create_block_mask(causal, None, None, length, length, device=a.device)
        return flex(q, k, v, score_mod=alibi if a.pe == "alibi" else None,
                    block_mask=masks[length])

    return _FlexDecoder(a, attend)


def _sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main():
    a = _args()
    torch.manual_seed(0)
    if a.device == "cpu":
        torch.set_num_threads(a.threads)
    model = (_xt_model(a) if a.impl == "xt" else _flex_model(a)).to(a.device)
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4,
                            **({"fused": True} if a.device.startswith("cuda") else {}))
    x = torch.randint(0, a.vocab, (a.batch, a.seq + 1), device=a.device)
    times = []
    out = dict(pe=a.pe, impl=a.impl, dim=a.dim, depth=a.depth, heads=a.heads, batch=a.batch,
               seq=a.seq, device=a.device, dtype=a.dtype)
    if a.impl == "xt":
        out["flash"] = a.pe != "t5" if a.flash < 0 else bool(a.flash)
    train = not (a.impl == "flex" and a.device == "cpu")
    if not train:
        out["train_skipped"] = "FlexAttention has no backward on CPU"
    for i in range(a.warmup + a.steps if train else 0):
        _sync(a.device)
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(a.device.split(":")[0], dtype=dtype, enabled=a.dtype == "bf16"):
            logits = model(x[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, a.vocab), x[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        _sync(a.device)
        if i >= a.warmup:
            times.append(time.perf_counter() - t)
    if train:
        med = statistics.median(times)
        out.update(step_s=med, train_tok_s=a.batch * a.seq / med, loss=float(loss))
        del logits, loss
    if a.eval_seq:
        del opt
        model.eval()
        y = torch.randint(0, a.vocab, (1, a.eval_seq), device=a.device)
        with torch.inference_mode(), torch.autocast(a.device.split(":")[0], dtype=dtype,
                                                    enabled=a.dtype == "bf16"):
            for _ in range(2):  # a warm-up (kernels, block mask), then the timed pass
                _sync(a.device)
                t = time.perf_counter()
                model(y)
                _sync(a.device)
                eval_s = time.perf_counter() - t
        out.update(eval_seq=a.eval_seq, eval_s=eval_s, eval_tok_s=a.eval_seq / eval_s)
    if a.device.startswith("cuda"):
        out["peak_mem_mb"] = torch.cuda.max_memory_allocated() / 2 ** 20
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(out))


if __name__ == "__main__":
    main()
