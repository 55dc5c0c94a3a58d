"""Llama 4 iRoPE: RoPE layers with a NoPE layer every k-th layer.

Llama 4's NoPE layers also multiply their queries by a temperature: that is
``model.logit_scale.kind = "temperature"`` with ``model.logit_scale.layers =
"nope"`` (one place for every length-aware scaling; the ``llama4`` preset of
configs/default.py sets it, with chunked RoPE layers and QK-norm on them).
"""

from posenc.checks import positive_int
from posenc.encodings import irope
from posenc.model.encodings.rope import RoPE
from posenc.model.options import Option
from posenc.model.registry import register_encoding


@register_encoding("irope")
class IRoPE(RoPE):
    """RoPE, but every nope_every-th layer (ids nope_every - 1, ...) is NoPE."""

    relative = True
    paper = "Llama 4 (Meta 2025)"
    pure = "posenc.encodings.irope"
    nope_every = Option(4, positive_int, "NoPE at layer ids nope_every - 1, 2 nope_every - 1, ...")

    @classmethod
    def layer_is_nope(cls, options, *, layer_index, num_layers):
        kinds = irope.layer_kinds(num_layers, nope_every=options["nope_every"])
        return kinds[layer_index] == "nope"

    def setup(self, rngs, first):
        super().setup(rngs, first)
        self.nope = self.layer_is_nope({"nope_every": self.nope_every}, layer_index=self.layer_index,
                                       num_layers=self.num_layers)

    @property
    def has_pair_logits(self):  # a remapping acts on the RoPE layers only
        return super().has_pair_logits and not self.nope

    def query(self, q, positions, *, seq_len):
        return q if self.nope else super().query(q, positions, seq_len=seq_len)

    def key(self, k, positions, *, seq_len):
        return k if self.nope else super().key(k, positions, seq_len=seq_len)
