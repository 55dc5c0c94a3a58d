"""Fixed sinusoidal absolute embedding added to the token embeddings."""

from posenc.checks import one_of, positive
from posenc.encodings import absolute
from posenc.model.encoding import Encoding
from posenc.model.options import Option
from posenc.model.registry import register_encoding


@register_encoding("sinusoidal")
class Sinusoidal(Encoding):
    """Fixed sinusoidal absolute embedding (interleaved or concatenated sin / cos)."""

    paper = "Vaswani et al. 2017"
    pure = "posenc.encodings.absolute"
    layout = Option("interleaved", one_of(*absolute.LAYOUTS), "interleaved (paper) | concat (tensor2tensor)")
    base = Option(10000.0, positive, "wavelength base")

    def embed(self, positions, dim):
        return absolute.sinusoidal(positions, dim, base=self.base, layout=self.layout)
