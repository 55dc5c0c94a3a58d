"""RoPE with every frequency scaling of posenc.rope.KINDS (PI, NTK, dynamic NTK, YaRN, LongRoPE,
Llama 3) and every training-free position remapping of :data:`REMAPS` (Self-Extend, ReRoPE, Dual
Chunk Attention, STRING, StreamingLLM, LM-Infinite).

A remapping (``model.position.rope.remap``) changes which positions q and k are rotated at per
(query, key) pair (``posenc.remap``): the unit leaves q and k unrotated in ``qk`` and gives
attention ``pair_logits`` instead, which for every tile (dense rows, blocked tiles, the cached
keys when decoding) computes one logit set per region of the method's ``regions`` (q rotated at
the region's q positions, k at its k positions, frequencies times the region's scale) and
merges them by the regions' masks, as the official implementations do; pairs no region holds
are masked (StreamingLLM's and LM-Infinite's dropped keys). The scaling still sets the
frequencies (Self-Extend or DCA with NTK / YaRN: frequencies from the scaling, positions from the
remapping). The KV cache keeps every token's unrotated key and its position, so cached decoding
gives the full forward's logits; for StreamingLLM that is the official rolling cache's result
(positions by cache slot: ``posenc.sinks``), with the evicted keys masked instead of freed.
"""

import typing

import jax.numpy as jnp
import numpy as np

from posenc import checks
from posenc.checks import boolean, nonnegative_int, one_of, optional, positive, positive_floats
from posenc.encodings.rope import dual_chunk, rerope, rope, rope_scaling, self_extend, string_shift
from posenc.encodings.rope import sinks as sinks_lib
from posenc.model.encoding import Encoding
from posenc.model.options import Option
from posenc.model.registry import register_encoding


class Remap(typing.NamedTuple):
    """A training-free remapping: its pure ``regions`` function and the options it reads."""

    regions: typing.Callable  # (q_positions, k_positions, **options) -> [posenc.remap.Region]
    required: tuple[str, ...]  # options it needs set
    optional: tuple[str, ...] = ()  # options it reads when set (None: the pure default)
    paper: str = ""


# remap -> its pure regions and options (model.position.rope.<option>, the pure keywords)
REMAPS = {
    "none": None,
    "self_extend": Remap(self_extend.regions, ("group", "window"), paper="Jin et al. 2024"),
    "rerope": Remap(rerope.regions, ("window",), ("leaky",), paper="Su 2023"),
    "dual_chunk": Remap(dual_chunk.regions, ("chunk", "local_window"), paper="An et al. 2024"),
    "string": Remap(string_shift.regions, ("shift", "local_window"), paper="An et al. 2025"),
    "streaming_llm": Remap(sinks_lib.regions, ("sinks", "window"), paper="Xiao et al. 2024"),
    "lm_infinite": Remap(sinks_lib.lm_infinite_regions, ("global_branch", "local_branch"), ("limit",),
                         paper="Han et al. 2024"),
}
_REMAP_OPTIONS = sorted({n for r in REMAPS.values() if r for n in r.required + r.optional})

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
    pure = "posenc.encodings.rope.rope"
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
    remap = Option("none", one_of(*REMAPS), "training-free position remapping (REMAPS; posenc.remap)")
    group = Option(None, optional(nonnegative_int), "self_extend: group size G", type=int)
    window = Option(None, optional(nonnegative_int), "self_extend: neighbor window W; rerope: w; "
                    "streaming_llm: recent keys", type=int)
    leaky = Option(None, optional(positive), "rerope: Leaky ReRoPE's k (None: ReRoPE)", type=float)
    chunk = Option(None, optional(nonnegative_int), "dual_chunk: chunk size s", type=int)
    local_window = Option(None, optional(nonnegative_int), "dual_chunk: local window w; string: W",
                          type=int)
    shift = Option(None, optional(nonnegative_int), "string: shift S", type=int)
    sinks = Option(None, optional(nonnegative_int), "streaming_llm: sink tokens", type=int)
    global_branch = Option(None, optional(nonnegative_int), "lm_infinite: global keys", type=int)
    local_branch = Option(None, optional(nonnegative_int), "lm_infinite: local branch", type=int)
    limit = Option(None, optional(nonnegative_int), "lm_infinite: distance cap (None: none)", type=int)

    @classmethod
    def unused_options(cls, options):
        used = _KEYWORDS[options["scaling"]]
        r = REMAPS[options["remap"]]
        remapped = r.required + r.optional if r else ()
        return (tuple(k for k in _FREQUENCY_OPTIONS if k not in used)
                + tuple(k for k in _REMAP_OPTIONS if k not in remapped))

    @classmethod
    def rotates_in_attention(cls, options):
        return "remap" if options.get("remap", "none") != "none" else ""

    @classmethod
    def remap_options(cls, options) -> dict:
        """The keywords of the remapping's ``regions`` (those set among its optional ones)."""
        r = REMAPS[options["remap"]]
        kw = {k: options[k] for k in r.required}
        kw.update({k: options[k] for k in r.optional if options[k] is not None})
        return kw

    @classmethod
    def _check_remap(cls, options, prefix):
        name = options["remap"]
        r = REMAPS[name]
        missing = [k for k in r.required if options[k] is None]
        if missing:
            raise ValueError(f"{prefix}.remap={name!r} needs {', '.join(f'{prefix}.{k}' for k in missing)} "
                             f"(it reads {', '.join(r.required + r.optional)})")
        if options["scaling"] in rope_scaling.DEPENDS_ON_SEQ_LEN:
            static = [k for k in rope_scaling.KINDS if k not in rope_scaling.DEPENDS_ON_SEQ_LEN]
            raise ValueError(f"{prefix}.remap={name!r} needs frequencies that do not depend on the "
                             f"current length; {prefix}.scaling={options['scaling']!r} does (choose one "
                             f"of: {', '.join(static)})")
        try:  # the pure checks, on concrete positions
            r.regions(np.arange(2), np.arange(2), **cls.remap_options(options))
        except ValueError as e:
            raise ValueError(f"{prefix} (remap {name!r}): {e}") from None

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
        if options["remap"] != "none":
            cls._check_remap(options, prefix)

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
        return q if self.has_pair_logits else self._rotate(q, positions, seq_len)

    def key(self, k, positions, *, seq_len):
        return k if self.has_pair_logits else self._rotate(k, positions, seq_len)

    @property
    def has_pair_logits(self):
        return self.remap != "none"

    def static_key(self):
        # a static scaling rotates a key by its own position alone (xPos overrides qk: not static)
        return (type(self).qk is Encoding.qk and not self.has_pair_logits
                and self.scaling not in rope_scaling.DEPENDS_ON_SEQ_LEN)

    def regions(self, q_positions, k_positions):
        """The remapping's regions (``posenc.remap.Region``) of these positions."""
        opts = {k: getattr(self, k) for k in _REMAP_OPTIONS}
        opts["remap"] = self.remap
        return REMAPS[self.remap].regions(q_positions, k_positions, **self.remap_options(opts))

    def pair_logits(self, q, k, q_positions, k_positions, *, scale):
        """``scale q.k`` of the remapping: per region, q and k rotated at its positions (frequencies
        times its scale), merged by its mask; -> (float32 [B, H, Lq, Lk], visible [B | 1, Lq, Lk])."""
        inv_freq, factor = self.frequencies(0)  # static frequencies (checked)
        logits, visible = None, None
        for r in self.regions(q_positions, k_positions):
            inv = inv_freq if r.scale == 1.0 else inv_freq * r.scale
            qr = rope.apply(q, r.q_positions, inv, layout=self.layout, attention_factor=factor,
                            angles=self.angles)
            kr = rope.apply(k, r.k_positions, inv, layout=self.layout, attention_factor=factor,
                            angles=self.angles)
            s = jnp.einsum("bqhd,bkhd->bhqk", qr, kr, preferred_element_type=jnp.float32) * scale
            mask = r.mask[..., None, :, :]
            logits = s if logits is None else jnp.where(mask, s, logits)
            visible = r.mask if visible is None else visible | r.mask
        return logits, visible


def _defaults(names) -> dict:
    """``{option: default}`` of the RoPE options ``names``."""
    from posenc.model import options as options_lib

    defaults = {n: o.default for n, o in options_lib.options_of(RoPE).items()}
    return {name: defaults[name] for name in names}


def scaling_defaults() -> dict:
    """``{option: default}`` of every option a RoPE scaling reads (factor, original_length, the
    YaRN / Llama 3 / LongRoPE constants; base excluded): the fields to reset when a model
    changes its scaling, so the old scaling's options do not linger."""
    return _defaults(n for n in _FREQUENCY_OPTIONS if n != "base")


def remap_defaults() -> dict:
    """``{option: default}`` of the remapping and every option a remapping reads: the fields to
    reset when a model changes its remapping."""
    return _defaults(["remap", *_REMAP_OPTIONS])
