"""Llama 4 iRoPE: RoPE layers with a NoPE layer every k-th layer (query temperature there)."""

from posenc import irope
from posenc.model.encoding import register_encoding
from posenc.model.encodings.rope import RoPE
from posenc.model.options import Option, nonnegative, positive, positive_int


@register_encoding("irope")
class IRoPE(RoPE):
    """RoPE, but every nope_every-th layer (ids nope_every - 1, ...) is NoPE with a query temperature."""

    paper = "Llama 4 (Meta 2025)"
    pure = "posenc.irope"
    nope_every = Option(4, positive_int, "NoPE at layer ids nope_every - 1, 2 nope_every - 1, ...")
    floor_scale = Option(8192.0, positive, "NoPE temperature floor_scale")
    attn_scale = Option(0.1, nonnegative, "NoPE temperature attn_scale")

    def setup(self, rngs, first):
        super().setup(rngs, first)
        kinds = irope.layer_kinds(self.num_layers, nope_every=self.nope_every)
        self.nope = kinds[self.layer_index] == "nope"

    def query(self, q, positions, *, seq_len):
        if not self.nope:
            return super().query(q, positions, seq_len=seq_len)
        t = irope.nope_temperature(positions, floor_scale=self.floor_scale, attn_scale=self.attn_scale)
        return (q * t[..., None, None].astype(q.dtype)).astype(q.dtype)

    def key(self, k, positions, *, seq_len):
        return k if self.nope else super().key(k, positions, seq_len=seq_len)
