"""Hugging Face checkpoints into posenc's Decoder: ``config``, ``load`` and ``tokenize``.

``load(model_dir)`` reads a local checkpoint directory (``config.json`` and
``*.safetensors``, as ``save_pretrained`` or a hub download leaves them) and
returns a :class:`posenc.model.Decoder` whose ``decoder(tokens)`` gives the HF
model's logits (float32; tested within 1e-4 against transformers for every
family, full forward and cached decoding). ``config(model_dir)`` gives the
``model`` ConfigDict alone: the family's preset (``posenc.model.presets``)
with the checkpoint's sizes, RoPE, spans and norms. Parameters are read with
``safetensors``' numpy API (``pip install posenc[hf]``): torch is not needed.

Families (``config.json`` ``model_type``): llama (Llama 2 / 3.x, SmolLM),
mistral, qwen2, qwen3 (dense), smollm3, gemma2, gemma3_text, llama4_text,
olmo2, olmo3, exaone4, glm4, cohere2, gpt_neox, phi3, bloom, deepseek_v3, the
mixtures of experts (``model.moe``) mixtral, qwen3_moe, olmoe, gpt_oss (float
or MXFP4 experts, dequantized on load), glm4_moe, with deepseek_v3 and
llama4_text, and the hybrids of attention and recurrent mixers
(``model.layer_types``): qwen3_next (with its experts) and qwen3_5_text (Gated
DeltaNet), granitemoehybrid (with its experts), bamba and nemotron_h
(Mamba-2), falcon_h1 (attention and Mamba-2 side by side), lfm2 (short
convolutions), kimi_linear (Kimi Delta Attention and NoPE MLA). Nemotron-H's
and Kimi Linear's experts, multi-token-prediction layers' weights, DeepSeek-V4
(its compressed attention and hash routing) and vision towers (multimodal
llama4) are refused, each naming what posenc cannot express.
The tensors are read one at a time as they are placed
(:mod:`posenc.hf.checkpoint`), so loading a checkpoint peaks near the loaded
model's float32 size (``benchmarks/load_memory.py``).
Config formats of transformers 4.x (``rope_theta``,
``rope_scaling``) and 5.x (``rope_parameters``) are both read. An
unsupported architecture or field is a ValueError of one line naming it.

A loaded model is an ordinary posenc model: evaluate it at longer lengths
with another RoPE scaling by changing ``model.position.rope.*`` in the
config before building (``posenc.model.Decoder(cfg, ...)`` and
:func:`params` / :func:`assign`), or through ``load(model_dir,
overrides={...})``.

``tokenize(corpus, tokenizer_json, out)`` writes a nanoGPT-style ``.bin`` of
a text file with the model's ``tokenizer.json`` (``tokenizers``): uint16
when every id fits, else uint32; the text task reads it with
``task.options.tokens`` (and ``token_dtype``).
"""

from __future__ import annotations

import json
import os

import jax
import ml_collections
import numpy as np
from flax import nnx

import posenc.hf.families  # noqa: F401  (importing it registers every family)
from posenc.config import overrides as overrides_lib
from posenc.hf import registry
from posenc.hf.checkpoint import Checkpoint
from posenc.model import Decoder, ModelSpec, model_config
from posenc.model import moe as moe_lib


def _read_config(model_dir) -> dict:
    path = os.path.join(os.fspath(model_dir), "config.json")
    if not os.path.isfile(path):
        raise ValueError(f"{model_dir!s} has no config.json (a Hugging Face checkpoint directory "
                         "holds config.json and *.safetensors)")
    with open(path) as f:
        return json.load(f)


def config(model_dir, *, overrides=None) -> ml_collections.ConfigDict:
    """The ``model`` ConfigDict of the checkpoint in ``model_dir`` (see the module docstring).

    ``overrides``: dotted ``model.*`` fields set afterwards, e.g.
    ``{"model.position.rope.scaling": "yarn", ...}``; one that sets the RoPE scaling resets the
    checkpoint's scaling options it does not set (factor, original_length, ...) to their defaults.
    """
    hf = _read_config(model_dir)
    family = registry.family(hf)
    c = ml_collections.ConfigDict({"model": model_config()})
    overrides_lib.apply(c, family.fields(hf), where=f"{model_dir!s}/config.json")
    if overrides:
        overrides = dict(overrides)
        if "model.position.rope.scaling" in overrides:  # another scaling: the checkpoint's options go
            from posenc.model.encodings import rope as rope_unit

            for name, default in rope_unit.scaling_defaults().items():
                overrides.setdefault(f"model.position.rope.{name}", default)
        overrides_lib.apply(c, overrides, where="posenc.hf overrides")
    return c.model


def read_tensors(model_dir) -> Checkpoint:
    """The tensors of the ``*.safetensors`` files in ``model_dir``: a mapping that reads each when asked
    for, as float32 (uint8 ones, MXFP4 blocks and scales, as stored: the family dequantizes them)."""
    return Checkpoint(model_dir)


def params(model_dir, spec: ModelSpec, *, hf: dict | None = None,
           tensors: dict | None = None) -> dict:
    """The posenc parameters of the checkpoint: {flat state path: float32 array} for ``spec``."""
    hf = _read_config(model_dir) if hf is None else hf
    tensors = read_tensors(model_dir) if tensors is None else tensors
    return registry.family(hf).params(hf, tensors, spec)


def assign(model: Decoder, values: dict) -> Decoder:
    """Set the parameters of ``model`` (in place) from {flat path: array}; every one must be given (with
    DeepSeek-V3's correction biases, variables of the MoE that are not parameters)."""
    state = nnx.state(model, nnx.Any(nnx.Param, moe_lib.CorrectionBias))
    flat = nnx.traversals.flatten_mapping(nnx.to_pure_dict(state))
    missing = sorted(set(flat) - set(values))
    extra = sorted(set(values) - set(flat))
    if missing or extra:
        raise ValueError(f"checkpoint parameters do not fit the model: missing "
                         f"{['.'.join(map(str, p)) for p in missing[:4]]}, unexpected "
                         f"{['.'.join(map(str, p)) for p in extra[:4]]}")
    for path, want in flat.items():
        if tuple(values[path].shape) != tuple(want.shape):
            raise ValueError(f"parameter {'.'.join(map(str, path))} has shape {values[path].shape} "
                             f"in the checkpoint; the model wants {tuple(want.shape)}")
    new = nnx.traversals.unflatten_mapping({p: jax.numpy.asarray(v, jax.numpy.float32)
                                            for p, v in values.items()})
    nnx.replace_by_pure_dict(state, new)
    nnx.update(model, state)
    return model


def load(model_dir, *, overrides=None, seed: int = 0) -> Decoder:
    """The checkpoint in ``model_dir`` as a posenc Decoder (config and parameters).

    ``overrides``: dotted ``model.*`` fields changed before building (e.g. a
    RoPE scaling for context extension, ``model.dtype``). ``seed`` seeds the
    dropout streams only (every parameter comes from the checkpoint).
    """
    hf = _read_config(model_dir)
    cfg = config(model_dir, overrides=overrides)
    spec = ModelSpec.from_config(cfg)
    values = params(model_dir, spec, hf=hf)
    # Build without drawing the parameters: shapes only, then the checkpoint's values.
    abstract = nnx.eval_shape(lambda: Decoder(spec, rngs=nnx.Rngs(seed)))
    graph, state = nnx.split(abstract)
    flat = nnx.traversals.flatten_mapping(nnx.to_pure_dict(state))
    rng = {p: (jax.random.key(seed + i) if jax.dtypes.issubdtype(v.dtype, jax.dtypes.prng_key)
               else jax.numpy.zeros(v.shape, v.dtype))
           for i, (p, v) in enumerate(flat.items()) if p not in values}
    wanted = nnx.state(abstract, nnx.Any(nnx.Param, moe_lib.CorrectionBias))
    missing = sorted(p for p in nnx.traversals.flatten_mapping(nnx.to_pure_dict(wanted)) if p not in values)
    if missing:
        raise ValueError(f"checkpoint lacks parameter {'.'.join(map(str, missing[0]))}")
    for p, want in flat.items():
        if p in values and tuple(values[p].shape) != tuple(want.shape):
            raise ValueError(f"parameter {'.'.join(map(str, p))} has shape {values[p].shape} in the "
                             f"checkpoint; the model wants {tuple(want.shape)}")
    filled = dict(rng)
    for p in list(values):  # one tensor at a time: each host copy goes as its array comes
        filled[p] = jax.numpy.asarray(values.pop(p), jax.numpy.float32)
    nnx.replace_by_pure_dict(state, nnx.traversals.unflatten_mapping(filled))
    return nnx.merge(graph, state)


def tokenize(corpus, tokenizer_json, out, *, chunk_bytes: int = 1 << 20) -> int:
    """Tokenize the text file ``corpus`` with ``tokenizer_json`` into the nanoGPT ``.bin`` ``out``.

    The ids are written as uint16 when the tokenizer's vocabulary (added
    tokens included) fits in 16 bits, else uint32, with no header (numpy
    ``tofile``); read them with ``np.memmap(out, dtype)`` or the text task's
    ``tokens=out, token_dtype=...``. The text is encoded in pieces of about
    ``chunk_bytes`` that end at a newline, without special tokens. Returns
    the number of tokens written.
    """
    from tokenizers import Tokenizer

    if not os.path.isfile(os.fspath(corpus)):
        raise ValueError(f"corpus {corpus!s} is not a file (give one UTF-8 text file)")
    tok = Tokenizer.from_file(os.fspath(tokenizer_json))
    dtype = token_dtype(tok.get_vocab_size(with_added_tokens=True))
    count = 0
    tmp = os.fspath(out) + ".tmp"
    with open(corpus, encoding="utf-8") as src, open(tmp, "wb") as dst:
        while True:
            piece = src.read(chunk_bytes)
            if not piece:
                break
            piece += src.readline()  # end the piece at a newline
            ids = np.asarray(tok.encode(piece, add_special_tokens=False).ids, dtype)
            ids.tofile(dst)
            count += ids.size
    os.replace(tmp, out)
    return count


def token_dtype(vocab_size: int) -> str:
    """"uint16" when ids below ``vocab_size`` fit in 16 bits, else "uint32"."""
    return "uint16" if vocab_size <= 1 << 16 else "uint32"
