"""Hugging Face checkpoints: config and weights into a posenc Decoder, tokenization.

Not a pure package: it builds the model, so it sits above ``posenc.model``.
``posenc.hf.load`` and the rest are the functions of ``posenc.hf.hf``. The
families it reads are the modules of ``posenc.hf.families`` (one per family
or family group, each registering itself in ``posenc.hf.registry``), built
from the shared config readers ``posenc.hf.fields`` and
``posenc.hf.rope_fields`` and the tensor helpers of ``posenc.hf.hf_params``.
"""

from posenc.hf.hf import assign, config, load, params, read_tensors, token_dtype, tokenize

__all__ = ["assign", "config", "load", "params", "read_tensors", "token_dtype", "tokenize"]
