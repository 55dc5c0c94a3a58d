"""xPos: RoPE with a per-pair exponential decay, queries scaled up and keys down."""

from posenc.checks import one_of, positive
from posenc.encodings import xpos
from posenc.encodings.rope import rope
from posenc.model.encodings.rope import RoPE
from posenc.model.options import Option
from posenc.model.registry import register_encoding


@register_encoding("xpos")
class XPos(RoPE):
    """RoPE times zeta_i^((m - n) / scale_base), zeta_i = (2i + gamma d) / ((1 + gamma) d).

    Queries and keys are scaled relative to one common offset between them
    (posenc.xpos.apply_pair: torchscale's centre in a full forward, the query
    when decoding), so logits depend only on position differences and stay in
    float32 range: one call spans up to 2 * posenc.xpos.max_distance positions
    (54,390 at the defaults); longer sequences are refused before tracing.
    """

    relative = True
    paper = "Sun et al. 2022"
    pure = "posenc.encodings.xpos"
    layout = Option("interleaved", one_of(*rope.LAYOUTS), "pairs (2i, 2i + 1) (torchscale) | (j, j + d/2)")
    scale_base = Option(512.0, positive, "decay scale base")
    gamma = Option(0.4, positive, "zeta_i = (2i + gamma d) / ((1 + gamma) d)")

    @classmethod
    def check(cls, options, *, prefix, **kw):
        if options["remap"] != "none":
            raise ValueError(f"{prefix}.remap={options['remap']!r}: xPos's scaled keys have no "
                             "remapped form; a remapping takes position kind 'rope' (or 'irope')")
        super().check(options, prefix=prefix, **kw)

    @classmethod
    def longest_sequence(cls, options):
        return 2 * xpos.max_distance(scale_base=options["scale_base"], gamma=options["gamma"])

    def qk(self, q, k, q_positions, k_positions, *, seq_len):
        inv_freq, _ = self.frequencies(seq_len)
        return xpos.apply_pair(q, k, q_positions, k_positions, inv_freq, scale_base=self.scale_base,
                               gamma=self.gamma, layout=self.layout, angles=self.angles)
