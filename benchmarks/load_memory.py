"""Peak host memory of ``posenc.hf.load`` on a large checkpoint, against the loaded model's own size.

    python -m benchmarks.load_memory --gb 2.3 --dir /tmp/posenc_load_memory

Writes once (kept in ``--dir``) a synthetic Llama checkpoint of random bfloat16 weights of about ``--gb``
gigabytes in shards of at most 1 GB (hidden 2048, 16 heads of 128 with 4 key-value heads, SwiGLU of 5632,
vocabulary 32000, untied head; the layer count gives the size), then loads it with ``posenc.hf.load`` in a
fresh process and prints one JSON row: the checkpoint's bytes, the model's bytes (posenc keeps float32
parameters, twice a bfloat16 file), the process's resident memory before the load, its peak during it
(``VmHWM``, this process image's own: ``ru_maxrss`` keeps a large parent's across the exec), the load's
seconds, and ``peak_over_model``: (peak - before) / model bytes.
``posenc.hf.checkpoint`` reads a tensor at a time and the loader hands each on as it is placed, so the
ratio stays near 1; reading the whole checkpoint at once as float32 and converting it afterwards holds it
about three times over. ``--posenc_root`` puts another checkout first on the child's path, to measure an
earlier version of the loader on the same file.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, MLP, VOCAB = 2048, 16, 4, 128, 5632, 32000


def layer_shapes(hidden: int, heads: int, kv_heads: int, head_dim: int, mlp: int) -> dict[str, tuple]:
    return {"self_attn.q_proj.weight": (heads * head_dim, hidden),
            "self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
            "self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
            "self_attn.o_proj.weight": (hidden, heads * head_dim),
            "mlp.gate_proj.weight": (mlp, hidden), "mlp.up_proj.weight": (mlp, hidden),
            "mlp.down_proj.weight": (hidden, mlp),
            "input_layernorm.weight": (hidden,), "post_attention_layernorm.weight": (hidden,)}


def write_llama(out: str, *, layers: int, hidden=HIDDEN, heads=HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM,
                mlp=MLP, vocab=VOCAB, dtype="bfloat16", shard_bytes=1 << 30, seed=0) -> int:
    """A Llama checkpoint of random weights (std 0.02, norms 1) in ``out``; returns its tensors' bytes."""
    import ml_dtypes
    import numpy as np
    from safetensors.numpy import save_file

    np_dtype = {"bfloat16": ml_dtypes.bfloat16, "float32": np.float32}[dtype]
    os.makedirs(out, exist_ok=True)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
              "intermediate_size": mlp, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
              "head_dim": head_dim, "num_hidden_layers": layers, "vocab_size": vocab, "hidden_act": "silu",
              "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 4096,
              "tie_word_embeddings": False, "torch_dtype": dtype}
    shapes = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(layers):
        shapes.update({f"model.layers.{i}.{k}": s for k, s in layer_shapes(hidden, heads, kv_heads, head_dim,
                                                                            mlp).items()})
    shapes.update({"model.norm.weight": (hidden,), "lm_head.weight": (vocab, hidden)})
    rng = np.random.default_rng(seed)
    shard: dict = {}
    size = total = n = 0

    def flush():
        nonlocal shard, size, n
        if shard:
            save_file(shard, os.path.join(out, f"model-{n:05d}.safetensors.tmp"))
            os.replace(os.path.join(out, f"model-{n:05d}.safetensors.tmp"),
                       os.path.join(out, f"model-{n:05d}.safetensors"))
            shard, size, n = {}, 0, n + 1

    for name, shape in shapes.items():
        value = (np.ones(shape, np.float32) if len(shape) == 1
                 else rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)).astype(np_dtype)
        if size + value.nbytes > shard_bytes:
            flush()
        shard[name] = value
        size += value.nbytes
        total += value.nbytes
    flush()
    with open(os.path.join(out, "config.json"), "w") as f:  # last: a directory with it is complete
        json.dump(config, f, indent=1)
    return total


CHILD = r"""
import json, sys, time
import jax, posenc.hf
def status_kb(field):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith(field + ":"))
jax.numpy.zeros(8).block_until_ready()  # the CPU client's own memory is not the load's
before = status_kb("VmRSS")
t0 = time.perf_counter()
model = posenc.hf.load(sys.argv[1])
seconds = time.perf_counter() - t0
from flax import nnx
model_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
peak = status_kb("VmHWM")  # this image's own peak (ru_maxrss keeps a forking parent's across the exec)
print(json.dumps({"model_bytes": model_bytes, "rss_before_bytes": before * 1024, "peak_rss_bytes": peak * 1024,
                  "seconds": round(seconds, 1), "posenc": posenc.__file__}))
"""


def measure(directory: str, posenc_root: str | None = None) -> dict:
    """Load ``directory`` in a fresh process; its row (see the module docstring)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    if posenc_root:
        env["PYTHONPATH"] = os.pathsep.join([posenc_root, env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", CHILD, directory], env=env, capture_output=True, text=True,
                         check=True, cwd=posenc_root or None)
    row = json.loads(out.stdout.strip().splitlines()[-1])
    row["checkpoint_bytes"] = sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory)
                                  if f.endswith(".safetensors"))
    row["peak_over_model"] = round((row["peak_rss_bytes"] - row["rss_before_bytes"]) / row["model_bytes"], 3)
    return row


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gb", type=float, default=2.3, help="checkpoint size in GB (bfloat16)")
    p.add_argument("--dir", default="/tmp/posenc_load_memory")
    p.add_argument("--posenc_root", default=None, help="another checkout's root, first on the child's path")
    a = p.parse_args(argv)
    per_layer = sum(math.prod(s) for s in layer_shapes(HIDDEN, HEADS, KV_HEADS, HEAD_DIM, MLP).values())
    layers = max(1, round((a.gb * 1e9 / 2 - 2 * VOCAB * HIDDEN) / per_layer))
    if not os.path.isfile(os.path.join(a.dir, "config.json")):
        write_llama(a.dir, layers=layers)
    row = {"layers": layers, **measure(a.dir, a.posenc_root), "python": sys.version.split()[0],
           "cpus": os.cpu_count()}
    print(json.dumps(row))


if __name__ == "__main__":
    main()
