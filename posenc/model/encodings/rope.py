"""RoPE with every frequency scaling of posenc.rope.KINDS (PI, NTK, dynamic NTK, YaRN, LongRoPE, Llama 3)."""

from posenc import checks, rope, rope_scaling
from posenc.model.encoding import Encoding, register_encoding
from posenc.model.options import (Option, boolean, nonnegative_int, one_of, optional, positive,
                                  positive_floats)

# The keywords of posenc.rope.frequencies each scaling takes (seq_len is the current
# length, passed at run time): the scaling options of this unit are exactly these.
_KEYWORDS = {k: tuple(n for n in v if n != "seq_len") for k, v in rope_scaling.KEYWORDS.items()}
_FREQUENCY_OPTIONS = sorted({n for names in _KEYWORDS.values() for n in names})


def _fraction(name, value):
    return checks.number(name, value, minimum=0.0, maximum=1.0)


@register_encoding("rope")
class RoPE(Encoding):
    """Rotary embedding of queries and keys, any frequency scaling, half or interleaved pairs."""

    relative = True
    paper = "Su et al. 2021"
    pure = "posenc.rope"
    scaling = Option("default", one_of(*rope_scaling.KINDS), "frequency scaling (posenc.rope.KINDS)")
    layout = Option("half", one_of(*rope.LAYOUTS), "pairs (j, j + d/2) | (2i, 2i + 1)")
    angles = Option("exact", one_of(*rope.ANGLES), "exact: phases reduced mod 2 pi from integer "
                    "positions (logits shift invariant at any offset) | canonical: float32 p * inv_freq "
                    "(bitwise HF)")
    rotary_fraction = Option(1.0, positive, "rotate the first int(fraction * head_dim) dims")
    base = Option(10000.0, positive, "wavelength base")
    factor = Option(1.0, positive, "scaling factor s")
    original_length = Option(0, nonnegative_int, "training context length L (0: the task's)",
                             train_length=True)
    beta_fast = Option(32.0, positive, "YaRN")
    beta_slow = Option(1.0, positive, "YaRN")
    mscale = Option(None, optional(positive), "YaRN magnitude mscale", type=float)
    mscale_all_dim = Option(None, optional(positive), "YaRN mscale_all_dim", type=float)
    truncate = Option(True, boolean, "YaRN: floor / ceil the correction range")
    attention_factor = Option(None, optional(positive), "override the computed attention factor",
                              type=float)
    short_factor = Option((), positive_floats, "LongRoPE per-pair factors for n <= L")
    long_factor = Option((), positive_floats, "LongRoPE per-pair factors for n > L")
    low_freq_factor = Option(1.0, positive, "Llama 3")
    high_freq_factor = Option(4.0, positive, "Llama 3")
    temperature = Option("paper", one_of(*rope_scaling.TEMPERATURES),
                         "YaRN attention temperature: paper (HF) | quadratic")
    fraction = Option(1.0, _fraction, "p-RoPE (scaling=proportional): share of the pairs rotated")

    @classmethod
    def unused_options(cls, options):
        used = _KEYWORDS[options["scaling"]]
        return tuple(k for k in _FREQUENCY_OPTIONS if k not in used)

    @classmethod
    def check(cls, options, *, prefix, head_dim, **_):
        try:
            d = rope.rotary_dim(head_dim, options["rotary_fraction"])
        except ValueError as e:
            raise ValueError(f"{prefix}.rotary_fraction: {e}") from None
        scaling = options["scaling"]
        if scaling == "proportional" and options["rotary_fraction"] != 1.0:
            raise ValueError(
                f"{prefix}.rotary_fraction={options['rotary_fraction']!r} (GPT-NeoX partial rotary) "
                f"cannot be combined with scaling 'proportional' (p-RoPE, {prefix}.fraction): the two "
                "conventions give different frequency sets; choose one")
        if scaling in rope_scaling.NEEDS_ORIGINAL_LENGTH and not options["original_length"]:
            raise ValueError(f"{prefix}.scaling {scaling!r} needs {prefix}.original_length (the "
                             "training length); it is 0, which only a training run fills in")
        try:  # a bad combination fails here, before anything is built
            cls.frequencies_for(options, d, options["original_length"] or 1)
        except ValueError as e:
            raise ValueError(f"{prefix} (scaling {scaling!r}): {e}") from None

    @classmethod
    def frequencies_for(cls, options, rotary_dim, seq_len):
        scaling = options["scaling"]
        kw = {k: options[k] for k in _KEYWORDS[scaling]}
        for k in ("short_factor", "long_factor"):
            if k in kw:
                kw[k] = list(kw[k]) or None
        if scaling in rope_scaling.DEPENDS_ON_SEQ_LEN:
            kw["seq_len"] = seq_len
        return rope.frequencies(scaling, rotary_dim, **kw)

    def setup(self, rngs, first):
        # p-RoPE's frequencies span the head (its zero pairs are not rotated).
        self.rotary_dim = rope.rotary_dim(self.head_dim, self.rotary_fraction)

    def frequencies(self, seq_len):
        """(inv_freq, attention_factor) at the current length ``seq_len``."""
        opts = {k: getattr(self, k) for k in _KEYWORDS[self.scaling]}
        opts["scaling"] = self.scaling
        return self.frequencies_for(opts, self.rotary_dim, seq_len)

    def _rotate(self, x, positions, seq_len):
        inv_freq, factor = self.frequencies(seq_len)
        return rope.apply(x, positions, inv_freq, layout=self.layout, attention_factor=factor,
                          angles=self.angles)

    def query(self, q, positions, *, seq_len):
        return self._rotate(q, positions, seq_len)

    def key(self, k, positions, *, seq_len):
        return self._rotate(k, positions, seq_len)


def scaling_defaults() -> dict:
    """``{option: default}`` of every option a RoPE scaling reads (factor, original_length, the
    YaRN / Llama 3 / LongRoPE constants; base excluded): the fields to reset when a model
    changes its scaling, so the old scaling's options do not linger."""
    from posenc.model import options as options_lib

    defaults = {n: o.default for n, o in options_lib.options_of(RoPE).items()}
    used = {k for ks in rope_scaling.KEYWORDS.values() for k in ks} - {"base", "seq_len"}
    return {name: defaults[name] for name in sorted(used & set(defaults))}
