"""NoPE: no positional encoding; the causal mask alone carries order."""

from posenc.model.encoding import Encoding
from posenc.model.registry import register_encoding


@register_encoding("nope")
class NoPE(Encoding):
    """No positional encoding (causal mask only)."""

    relative = True
    paper = "Kazemnejad et al. 2023"
