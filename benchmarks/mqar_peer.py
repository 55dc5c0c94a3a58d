"""An MQAR learner outside posenc.model: does a plain RoPE decoder fit MQAR at the CPU grids' budget?

compare:hybrid_quick's RoPE arm plateaus on multi-query associative recall
(docs/results_hybrid.md, "Multi-query associative recall"). This script
trains a decoder written here in plain jax (pre-RMSNorm, RoPE attention,
GELU MLP, tied embeddings; no posenc.model code) on the same batches
(posenc.tasks' mqar) with the grid's optimizer (AdamW, b2 0.98, weight decay
0.1, clip 1.0, warmup 75 steps, cosine to a tenth), so a plateau seen in
both is the task and budget, not the library's model.

usage: python benchmarks/mqar_peer.py --keys 64 --pairs 4 --steps 4000 --lr 3e-3 --layers 2 --heads 4
Prints, every 250 steps, the step, the loss and the token accuracy over the
answer tokens of that step's training batch (32 examples).
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import optax

from posenc import tasks


def init(key, vocab: int, d: int, layers: int):
    keys = iter(jax.random.split(key, 1 + 4 * layers))

    def normal(*shape, scale=0.02):
        return scale * jax.random.normal(next(keys), shape)

    return {"emb": normal(vocab, d),
            "layers": [{"qkv": normal(d, 3 * d, scale=d ** -0.5), "o": normal(d, d, scale=d ** -0.5),
                        "w1": normal(d, 4 * d, scale=d ** -0.5), "w2": normal(4 * d, d, scale=(4 * d) ** -0.5)}
                       for _ in range(layers)]}


def rms(x):
    return x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + 1e-6)


def rope(x):
    """Rotate-half RoPE, base 10000, positions 0..L-1: x [B, L, H, hd]."""
    hd = x.shape[-1]
    angle = jnp.arange(x.shape[1])[:, None] * 10000.0 ** (-jnp.arange(0, hd, 2) / hd)
    c, s = jnp.cos(angle)[None, :, None], jnp.sin(angle)[None, :, None]
    x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
    return jnp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], -1)


def forward(p, tokens, heads: int):
    h = p["emb"][tokens]
    b, length, d = h.shape
    causal = jnp.tril(jnp.ones((length, length), bool))
    for layer in p["layers"]:
        q, k, v = (z.reshape(b, length, heads, d // heads) for z in jnp.split(rms(h) @ layer["qkv"], 3, -1))
        s = jnp.einsum("bqhd,bkhd->bhqk", rope(q), rope(k)) / (d // heads) ** 0.5
        w = jax.nn.softmax(jnp.where(causal, s, -1e9), -1)
        h = h + jnp.einsum("bhqk,bkhd->bqhd", w, v).reshape(b, length, d) @ layer["o"]
        h = h + jax.nn.gelu(rms(h) @ layer["w1"]) @ layer["w2"]
    return rms(h) @ p["emb"].T


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keys", type=int, default=64, help="keys, and as many values")
    ap.add_argument("--pairs", type=int, default=4, help="key-value pairs of the longest training example")
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--d_model", type=int, default=64)
    args = ap.parse_args()

    task = tasks.make("mqar", keys=args.keys, values=args.keys)
    length = task.seq_len(args.pairs) - 1

    def loss(p, batch):
        logp = jax.nn.log_softmax(forward(p, batch["inputs"], args.heads))
        ce = -jnp.take_along_axis(logp, batch["targets"][..., None], -1)[..., 0]
        m = batch["mask"]
        return (ce * m).sum() / m.sum(), ((logp.argmax(-1) == batch["targets"]) * m).sum() / m.sum()

    schedule = optax.warmup_cosine_decay_schedule(0.0, args.lr, 75, args.steps, args.lr * 0.1)
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, b2=0.98, weight_decay=0.1))
    params = init(jax.random.PRNGKey(0), task.vocab_size, args.d_model, args.layers)
    state = opt.init(params)

    @jax.jit
    def step(params, state, key):
        (value, acc), grads = jax.value_and_grad(loss, has_aux=True)(params, task.batch(key, 32, length))
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, value, acc

    for i in range(args.steps):
        params, state, value, acc = step(params, state, jax.random.PRNGKey(i + 1))
        if (i + 1) % 250 == 0:
            print(f"step {i + 1} loss {float(value):.4f} accuracy {float(acc):.4f}", flush=True)


if __name__ == "__main__":
    main()
