"""iRoPE (Llama 4): interleaved NoPE layers and the NoPE attention temperature.

Meta 2025, Llama 4 ("interleaved attention layers without positional
embeddings" plus inference-time temperature scaling, Nakanishi 2025,
"Scalable-Softmax Is Superior for Attention"). Layer ids ``nope_every - 1,
2 * nope_every - 1, ...`` use no positional encoding and full causal
attention; the others use RoPE. In Hugging Face ``Llama4TextAttention`` the
NoPE layers multiply the queries by the temperature
:func:`posenc.logit_scale.temperature`, also importable here under its
former name ``nope_temperature``.
"""

from __future__ import annotations

from posenc import checks
from posenc.attention import logit_scale

# The former name: the temperature now lives with the other length-aware logit scalings.
nope_temperature = logit_scale.temperature


def layer_kinds(num_layers: int, *, nope_every: int = 4, rope_kind: str = "rope") -> tuple[str, ...]:
    """Per-layer position kind: ``"nope"`` where ``(layer + 1) % nope_every == 0``, else ``rope_kind``.

    With the default 4: NoPE at layer ids 3, 7, 11, ... (as Llama 4's
    ``no_rope_layer_interval``). ``nope_every=1`` makes every layer NoPE
    (the same rule, taken literally). Raises ValueError for nope_every < 1
    or num_layers < 0.
    """
    for name, value in (("num_layers", num_layers), ("nope_every", nope_every)):
        checks.integer(name, value)
    if num_layers < 0:
        raise ValueError(f"num_layers must be >= 0, got {num_layers}")
    if nope_every < 1:
        raise ValueError(f"nope_every must be >= 1 (1 = every layer NoPE), got {nope_every}")
    if not isinstance(rope_kind, str) or not rope_kind or rope_kind == "nope":
        raise ValueError(f"rope_kind must be a non-empty position kind other than 'nope', got {rope_kind!r}")
    return tuple("nope" if (i + 1) % nope_every == 0 else rope_kind for i in range(num_layers))
