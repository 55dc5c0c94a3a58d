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

    The offset cancels only in q . k, so nothing may normalise the scaled q
    and k (:meth:`counter_scales_qk`): nGPT (placement ``ngpt``) and
    ``model.norm.qk_norm_after_rope`` divide each by its length, and
    ||zeta^((m - c) / scale_base) * R_m q|| weighs the pairs i by factors
    that move with c, unevenly (zeta_0 = 2/7, zeta_(d/2-1) ~ 1 at the
    defaults). The normalised logits then depend on c: a full forward (c the
    centre) and cached decoding (c the query) of the same tokens differ (7e-5
    on 11 tokens, and by order 1 once queries and keys lie thousands of
    positions apart), so neither is the model. The factors reach 2^96, and
    a norm squares them past float32 range as well. Validation refuses both
    combinations before anything compiles.
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
    def counter_scales_qk(cls, options):
        return True

    @classmethod
    def longest_sequence(cls, options):
        return 2 * xpos.max_distance(scale_base=options["scale_base"], gamma=options["gamma"])

    def qk(self, q, k, q_positions, k_positions, *, seq_len):
        inv_freq, _ = self.frequencies(seq_len)
        return xpos.apply_pair(q, k, q_positions, k_positions, inv_freq, scale_base=self.scale_base,
                               gamma=self.gamma, layout=self.layout, angles=self.angles)
