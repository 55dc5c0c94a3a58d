"""2D RoPE for grids (Heo et al. 2024, naver-ai/rope-vit): axial, or RoPE-Mixed with learned frequencies."""

import jax.numpy as jnp
from flax import nnx

from posenc.checks import boolean, one_of, optional, positive
from posenc.encodings.rope import mrope, rope
from posenc.model.encoding import Rotation
from posenc.model.options import Option
from posenc.model.registry import register_encoding

VARIANTS = ("axial", "mixed")
BASES = {"axial": 100.0, "mixed": 10.0}  # rope-vit's rope_theta of each variant


@register_encoding("rope_2d")
class RoPE2D(Rotation):
    """Queries and keys rotated by a position on two axes (row, col): positions [B | 1, L, 2].

    axial: half the frequencies turn with the row, half with the column
    (``posenc.mrope.axial_frequencies``, sections (d/4, d/4)); mixed (RoPE-Mixed): pair j of
    head h turns by ``f_row[h, j] row + f_col[h, j] col`` with learned frequencies
    (``freqs``, a parameter per layer and key head [2, K, d/2], initially
    ``posenc.mrope.mixed_frequencies``; a query head uses its key head's, so that GQA keeps
    every logit relative). rope-vit's (x, y) is (col, row); the unit reads the last two
    axes of a task's (t, h, w) ids. Keys are cached rotated.
    """

    relative = True
    paper = "Heo et al. 2024"
    pure = "posenc.encodings.rope.mrope"
    variant = Option("axial", one_of(*VARIANTS), "axial: fixed frequencies per axis | mixed: learned "
                     "per-head frequencies mixing both axes (RoPE-Mixed)")
    base = Option(None, optional(positive), "frequency base (None: rope-vit's, 100 axial, 10 mixed)",
                  type=float)
    rotate = Option(True, boolean, "mixed: initial directions at random angles per head (rope-vit)")
    layout = Option("interleaved", one_of(*rope.LAYOUTS), "pairs (2i, 2i + 1) (rope-vit) | (j, j + d/2)")
    angles = Option("exact", one_of(*rope.ANGLES), "exact: phases reduced mod 2 pi from integer "
                    "positions | canonical: float32 f * p (rope-vit)")

    @classmethod
    def position_axes(cls, options):
        return 2

    @classmethod
    def unused_options(cls, options):
        return ("rotate",) if options["variant"] == "axial" else ()

    @classmethod
    def check(cls, options, *, prefix, head_dim, **_):
        if head_dim % 4:
            raise ValueError(f"{prefix}: 2D RoPE needs head_dim a multiple of 4 (a pair of dims per axis and "
                             f"frequency); got {head_dim}")

    def setup(self, rngs, first):
        self.freq_base = BASES[self.variant] if self.base is None else self.base
        if self.variant == "mixed":
            self.freqs = nnx.Param(mrope.mixed_frequencies(rngs.params(), self.head_dim, self.num_kv_heads,
                                                           base=self.freq_base, rotate=self.rotate))

    def rotated(self, x, positions):
        positions = jnp.moveaxis(positions, -1, 0)  # [2, B | 1, L]: (row, col)
        if self.variant == "axial":
            d = self.head_dim
            return mrope.apply(x, positions, mrope.axial_frequencies(d, base=self.freq_base),
                               sections=(d // 4, d // 4), layout=self.layout, angles=self.angles)
        freqs = self.freqs[...]
        if x.shape[-2] != freqs.shape[1]:  # queries: each head reads its key head's frequencies
            freqs = jnp.repeat(freqs, x.shape[-2] // freqs.shape[1], axis=1)
        return mrope.apply_mixed(x, positions, freqs, layout=self.layout, angles=self.angles)
