"""Hugging Face checkpoints: config and weights into a posenc Decoder, tokenization.

Not a pure package: it builds the model, so it sits above ``posenc.model``.
``posenc.hf.load`` and the rest are the functions of ``posenc.hf.hf``; the
families it reads are in ``posenc.hf.hf_families`` (config) and
``posenc.hf.hf_params`` (tensors).
"""

from posenc.hf.hf import assign, config, load, params, read_tensors, token_dtype, tokenize

__all__ = ["assign", "config", "load", "params", "read_tensors", "token_dtype", "tokenize"]
