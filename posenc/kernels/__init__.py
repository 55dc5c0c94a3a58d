"""Pallas kernels: fused flash attention with in-kernel position terms.

jax only (no Flax, no posenc.model). ``flash_attention`` is the entry point,
``supported`` says whether it can run a call, ``terms`` builds the position
terms (ALiBi, T5, KERPLE, FIRE, FoX) and ``score_term`` defines the interface
for new ones.
"""

from posenc.kernels import score_term, terms
from posenc.kernels.flash import flash_attention, resolve_backend, supported
from posenc.kernels.score_term import Term

__all__ = ["flash_attention", "supported", "resolve_backend", "terms", "score_term", "Term"]
