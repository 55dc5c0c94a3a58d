"""Regenerate tests/data/hf_rope_frequencies.{npz,json} from HuggingFace transformers.

Not run by the test suite (it needs torch and transformers):
    python -m venv /tmp/hf && /tmp/hf/bin/pip install torch transformers
    /tmp/hf/bin/python tests/data/make_hf_rope_fixture.py
The fixture was made with transformers 5.24.0 and torch 2.13.0 (CPU).
"""
import json
import os
import random

import numpy as np
import torch
from transformers import modeling_rope_utils as m


class Cfg:
    def __init__(s, rp, head_dim, maxpos):
        s.rope_parameters = rp; s.head_dim = head_dim; s.hidden_size = head_dim * 4; s.num_attention_heads = 4
        s.max_position_embeddings = maxpos
    def standardize_rope_params(s): pass
rng = random.Random(0); cases = []; outs = {}
def _default(cfg, device=None, seq_len=None):
    p = cfg.rope_parameters; d = int(cfg.head_dim * p.get("partial_rotary_factor", 1.0))
    return 1.0 / (p["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d)), 1.0
fns = {"default": _default, "linear": m._compute_linear_scaling_rope_parameters,
       "dynamic": m._compute_dynamic_ntk_parameters, "yarn": m._compute_yarn_parameters,
       "longrope": m._compute_longrope_parameters, "llama3": m._compute_llama3_parameters}
for _ in range(600):
    kind = rng.choice(list(fns))
    head_dim = rng.choice([8, 16, 32, 48, 64, 80, 96, 128, 256])
    frac = rng.choice([1.0, 1.0, 0.5, 0.25, 0.75])
    d = int(head_dim * frac)
    if d % 2 or d < 4: continue
    base = rng.choice([10000.0, 500000.0, 150000.0, 1e6, 100.0, 10.0, 2.0, 1234.5])
    factor = rng.choice([1.0, 1.5, 2.0, 4.0, 8.0, 10.0, 16.0, 32.0, 40.0, 64.0])
    L = rng.choice([16, 128, 512, 2048, 4096, 8192, 4000])
    rp = {"rope_theta": base, "partial_rotary_factor": frac, "rope_type": kind}
    kw = dict(base=base)
    seq = None
    if kind != "default":
        rp["factor"] = factor; kw["factor"] = factor
    if kind == "dynamic":
        seq = rng.choice([None, L // 2, L, L + 1, 3 * L, 16 * L]); kw["original_length"] = L; kw["seq_len"] = seq
    if kind in ("yarn", "longrope", "llama3"):
        rp["original_max_position_embeddings"] = L; kw["original_length"] = L
    if kind == "yarn":
        bf, bs = rng.choice([(32, 1), (64, 2), (16, 1), (32.0, 0.5), (8, 4)])
        rp.update(beta_fast=bf, beta_slow=bs); kw.update(beta_fast=float(bf), beta_slow=float(bs))
        tr = rng.choice([True, False]); rp["truncate"] = tr; kw["truncate"] = tr
        ms = rng.choice([None, (1.0, 1.0), (0.707, 0.707), (1.0, 0.0), (1.0, 0.5)])
        if ms: rp.update(mscale=ms[0], mscale_all_dim=ms[1]); kw.update(mscale=ms[0], mscale_all_dim=ms[1])
        if rng.random() < 0.2: rp["attention_factor"] = 1.3; kw["attention_factor"] = 1.3
    if kind == "longrope":
        sf = [round(rng.uniform(1, 3), 4) for _ in range(d // 2)]
        lf = [round(rng.uniform(1, 60), 4) for _ in range(d // 2)]
        rp.update(short_factor=sf, long_factor=lf); kw.update(short_factor=sf, long_factor=lf)
        seq = rng.choice([None, L // 2, L, L + 1, 4 * L]); kw["seq_len"] = seq
        if rng.random() < 0.2: rp["attention_factor"] = 1.1; kw["attention_factor"] = 1.1
    if kind == "llama3":
        a, b = rng.choice([(1.0, 4.0), (1.0, 2.0), (2.0, 8.0), (0.5, 4.0)])
        rp.update(low_freq_factor=a, high_freq_factor=b); kw.update(low_freq_factor=a, high_freq_factor=b)
    cfg = Cfg(rp, head_dim, L if kind == "dynamic" else 4 * L)
    try:
        inv, af = fns[kind](cfg, "cpu", seq) if kind != "default" else fns[kind](cfg, "cpu")
    except Exception:
        continue
    outs[str(len(cases))] = inv.numpy().astype(np.float32)
    cases.append(dict(kind=kind, d=d, kw=kw, af=float(af)))
here = os.path.dirname(os.path.abspath(__file__))
np.savez_compressed(os.path.join(here, "hf_rope_frequencies.npz"), **outs)
json.dump(cases, open(os.path.join(here, "hf_rope_frequencies.json"), "w"))
print(len(cases))
