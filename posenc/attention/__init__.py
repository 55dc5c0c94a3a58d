"""Attention units as pure functions (jax only): the data-dependent ones (Forgetting
Transformer, stick-breaking attention, PaTH), learned attention sinks, gated
attention outputs and length-aware logit scaling.

Each module is public as ``posenc.<name>`` (see ``posenc/__init__.py``).
"""
