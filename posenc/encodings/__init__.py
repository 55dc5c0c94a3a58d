"""Positional encodings as pure functions (jax only): absolute, additive biases
(ALiBi, T5, KERPLE, FIRE, Shaw, Transformer-XL), xPos, CoPE, Abacus, position
coupling, iRoPE, exact rotation phases, and the RoPE family in ``rope/``.

Each module is public as ``posenc.<name>`` (see ``posenc/__init__.py``).
"""
