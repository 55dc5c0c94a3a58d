"""The RoPE family as pure functions (jax only): rotary embeddings, their
frequency scalings (PI, NTK, YaRN, LongRoPE and their search), position remaps
(ReRoPE, Self-Extend, dual chunk attention, STRING, attention sinks).

Each module is public as ``posenc.<name>``: ``posenc.rope`` is ``posenc.encodings.rope.rope``.
"""
