"""M-RoPE: multi-axis RoPE of Qwen2-VL (contiguous sections) and Qwen3-VL (interleaved)."""

import jax.numpy as jnp

from posenc import checks
from posenc.checks import boolean, one_of, positive
from posenc.encodings.rope import mrope, rope
from posenc.model.encoding import Rotation
from posenc.model.options import Option
from posenc.model.registry import register_encoding


def _sections(name, value):
    if not isinstance(value, (tuple, list)):
        raise ValueError(f"{name} must be a tuple of non-negative integers (one per axis); got {value!r}")
    return tuple(checks.integer(f"{name}[{i}]", v, minimum=0) for i, v in enumerate(value))


@register_encoding("mrope")
class MRoPE(Rotation):
    """RoPE whose frequency j turns with the position on axis(j) (``posenc.mrope.apply``).

    Positions [B | 1, L, A] (A = len(sections); 3 by default: Qwen2-VL's (t, h, w)),
    e.g. a grid task's ids built like ``get_rope_index`` (``posenc.mrope.position_ids``).
    The same ids on every axis (a one-axis task) make it plain RoPE. ``sections`` ()
    splits the head's d/2 frequencies in Qwen2-VL's proportions (16, 24, 24) / 64, or
    Qwen3-VL's (24, 20, 20) / 64 when ``interleaved``. Keys are cached rotated.
    """

    relative = True
    paper = "Wang et al. 2024 (Qwen2-VL)"
    pure = "posenc.encodings.rope.mrope"
    sections = Option((), _sections, "frequencies per axis, summing to head_dim / 2 (Qwen2-VL mrope_section; "
                      "(): 3 axes in Qwen2-VL's, or interleaved Qwen3-VL's, proportions)", type=tuple)
    interleaved = Option(False, boolean, "False: contiguous sections (Qwen2-VL) | True: interleaved "
                         "axes T H W T H W ... (Qwen3-VL)")
    base = Option(10000.0, positive, "wavelength base")
    layout = Option("half", one_of(*rope.LAYOUTS), "pairs (j, j + d/2) (Hugging Face) | (2i, 2i + 1)")
    angles = Option("exact", one_of(*rope.ANGLES), "exact: phases reduced mod 2 pi from integer "
                    "positions | canonical: float32 p * inv_freq (bitwise HF)")

    @classmethod
    def sections_for(cls, options, *, head_dim) -> tuple[int, ...]:
        """The sections of these options for ``head_dim`` (the default split when ())."""
        if options["sections"]:
            return tuple(options["sections"])
        f = head_dim // 2
        side = f * 5 // 16 if options["interleaved"] else f * 3 // 8
        return (f - 2 * side, side, side)

    @classmethod
    def position_axes(cls, options):
        return len(options["sections"]) or 3

    @classmethod
    def check(cls, options, *, prefix, head_dim, **_):
        if head_dim % 2:
            raise ValueError(f"{prefix}: M-RoPE rotates pairs of dims; head_dim {head_dim} is odd")
        sections = cls.sections_for(options, head_dim=head_dim)
        if sum(sections) != head_dim // 2:
            raise ValueError(f"{prefix}.sections {sections} must sum to head_dim / 2 = {head_dim // 2}; "
                             f"they sum to {sum(sections)}")
        try:
            mrope.frequency_axes(sections, interleaved=options["interleaved"])
        except ValueError as e:
            raise ValueError(f"{prefix}.sections: {e}") from None

    def setup(self, rngs, first):
        self.axis_sections = self.sections_for({"sections": self.sections, "interleaved": self.interleaved},
                                               head_dim=self.head_dim)

    def rotated(self, x, positions):
        inv_freq, _ = rope.frequencies("default", self.head_dim, base=self.base)
        return mrope.apply(x, jnp.moveaxis(positions, -1, 0), inv_freq, sections=self.axis_sections,
                           interleaved=self.interleaved, layout=self.layout, angles=self.angles)
