"""The encoding protocol: :class:`Encoding`, the unit attention calls, and what it declares.

An encoding is one self-describing unit: a subclass of :class:`Encoding`
that declares, in one place, its config name (``register_encoding`` of
``posenc.model.registry``), its options (``Option`` class attributes:
config fields, defaults, checks), extra validation (:meth:`Encoding.check`),
its NNX parameters (:meth:`Encoding.setup`) and the protocol methods below.
Where it touches attention is read off the methods it overrides, so it is
never declared twice. The math lives in its pure module (``posenc.<name>``, a module of
``posenc/encodings``, ``posenc/norms`` or ``posenc/attention``; see ``pure``).

Protocol (every method is a no-op here; attention calls them and never
branches on the kind):

- ``embed(positions, dim)``: a vector per position added to the token
  embeddings (sinusoidal, learned); such encodings act at the input and
  their layers attend without position terms;
- ``token_embed(tokens, positions, dim, *, key, state) -> (vectors, state)``:
  the same, for input units that read the token ids (Abacus: a row per
  digit's place in its number). ``tokens`` int [B, L] (None when the model
  is called on embeddings, ``Decoder.forward_embeddings``); ``key`` a PRNG
  key for training-time randomness (Abacus's offset), None at evaluation
  and in decoding; ``state`` the unit's state before the first of these
  tokens (None: :meth:`init_state`'s), the returned one after the last:
  the KV cache keeps it (``input_state``) so that decoding in pieces equals
  one pass. The default calls ``embed`` and keeps the state;
- ``qk(q, k, q_positions, k_positions, *, seq_len)``: rotate or scale queries
  and keys (RoPE family, xPos); the default calls ``query`` and ``key``;
- ``bias(q_positions, k_positions)``: a logit bias from positions only
  (ALiBi, T5, KERPLE, FIRE);
- ``content_logits(q, k, q_positions, k_positions, *, scale, q_offset)``: a
  logit term from content and positions (Shaw, Transformer-XL, CoPE);
  ``q_offset`` is the index of the first query among the keys; both terms
  are added to ``scale * q.k`` before soft-capping;
- ``pair_logits(q, k, q_positions, k_positions, *, scale)``: the ``scale *
  q.k`` term itself, for units whose rotation depends on the (query, key)
  pair and not on each token alone (RoPE with a training-free remapping,
  ``model.position.rope.remap``: per region, q and k rotated at that
  region's positions, merged by its mask) -> ``(logits [B, H, Lq, Lk],
  visible bool [B | 1, Lq, Lk] or None)``; ``visible`` narrows the mask
  (keys the unit drops). Only called when the instance's
  ``has_pair_logits`` is true; its ``qk`` then leaves q and k unrotated;
- ``values(weights, q_positions, k_positions)``: a term added to ``w @ v``
  (Shaw), linear in ``weights`` so the online softmax may rescale it;
- ``constrain()``: project parameters back into their domain after an
  optimizer update (KERPLE keeps its parameters >= 0.01);
- ``kernel_terms(q_positions, k_positions)``: the unit's ``bias`` as
  ``posenc.kernels`` score terms, which the fused attention kernel
  evaluates per tile (``posenc.model.fused``); ``()`` when the unit adds
  nothing to the logits (RoPE, NoPE), ``None`` when it has no in-kernel form
  (the default for a unit with a ``bias``, and for every unit with content
  logits or values): attention then keeps the XLA path.

Data-dependent units (FoX, stick-breaking, PaTH) use the hooks :class:`Encoding`
inherits from ``posenc.model.data_dependent.DataDependentHooks`` as well:
``prepare``, ``init_state``, ``cached_features``, ``feature_bias``,
``attention``, ``output`` and ``update_cache`` (terms from the layer input,
their own attention weights, a decoding state and rewritten cached keys).

Declarations (classmethods that config validation reads, each documented
below) say what the unit needs or refuses: the width of q and k after ``qk``
(``qk_head_dim``: PoPE widens them), the option that makes its ``bias`` hide
keys, rotate per (query, key) pair or normalise q and k itself, whether it
scales q and k by reciprocal factors (``counter_scales_qk``), the position
axes it reads and the longest sequence it encodes. Class facts
(``full_rows``, ``paper``, ``pure``, ``relative``, ``spans``) are commented
below. ``seq_len`` (the current length, as HF defines it for length-dependent
RoPE: the largest position + 1, over the cached keys too in decoding; the
static L for the default positions 0..L-1, else a traced scalar) is passed
to every ``qk``; options with ``train_length=True`` (0 = the task's
training length) carry the original length.

Positions arrive as int32 ``[B, L]`` or ``[1, L]`` (shared by the batch);
every method must broadcast them against the batch of q and k. A unit that
reads several position axes (M-RoPE's (t, h, w), 2D RoPE's (row, col))
declares how many in ``position_axes(options)`` (a classmethod, default 1)
and gets ``[B | 1, L, A]`` instead: the axis last, so that the token axis
stays axis 1 for attention's blocks and the cache's slots (the pure
functions take them axis first: ``jnp.moveaxis(positions, -1, 0)``). A model
of such units takes positions ``[B | 1, L, A]`` (or one axis ``[L]`` /
``[B, L]``, the same ids on every axis, which makes M-RoPE plain RoPE), its
cache keeps them ``[B, S, A]``, ``seq_len`` is the largest id over every axis
+ 1 and decoding continues at that id on every axis (Qwen2-VL); its one-axis
units (NoPE layers, an input unit) read axis 0. Every multi-axis unit of a
model reads the same number of axes.

docs/api.md ("The encoding protocol") gives every hook's arguments, shapes,
dtypes and return value and when attention calls it (full forward, blocked
path, decoding with a cache); ``posenc.model.check_encoding`` runs a unit
through the properties they must keep. A unit with a ``bias`` but no
``kernel_terms`` runs the XLA path on GPU / TPU
(``posenc.model.fused.NoKernelFormWarning``).
"""

from __future__ import annotations

from typing import ClassVar

from flax import nnx

from posenc.model.data_dependent import DataDependentHooks

# Protocol methods and the attach point each stands for (tables, attention's fast path).
ATTACH_POINTS = {
    "embed": "embeddings",
    "token_embed": "embeddings",
    "query": "queries, keys",
    "key": "queries, keys",
    "qk": "queries, keys",
    "pair_logits": "queries, keys",
    "bias": "logits",
    "content_logits": "logits",
    "feature_bias": "logits",
    "attention": "attention weights",
    "values": "values",
    "output": "output",
}

# Attention spans of a layer (model.attention_span, model.layer_spans): every key up to the
# query, a sliding window of W keys, or the keys in the query's chunk of C (Llama 4).
SPANS = ("full", "window", "chunk")


class Encoding(DataDependentHooks, nnx.Module):
    """NoPE behaviour and the protocol every encoding follows (see the module docstring).

    Construction: ``cls(options, d_model=, num_heads=, num_kv_heads=,
    head_dim=, layer_index=, num_layers=, rngs=, first=)`` with ``options`` the
    validated dict of :func:`posenc.model.options.read`; every option becomes
    an attribute, then :meth:`setup` creates the parameters. ``first`` is the
    model's first unit of the same kind (None for that one), for parameters
    shared across layers (T5's table).
    """

    name: ClassVar[str] = ""  # the config name, set by register_encoding
    paper: ClassVar[str] = ""  # e.g. "Press et al. 2021"
    pure: ClassVar[str] = ""  # e.g. "posenc.alibi"
    full_rows: ClassVar[bool] = False  # needs every key of a query row at once
    # logits depend on positions only through their differences: adding one offset to every
    # position changes nothing (tests/test_position_invariance.py checks it through the decoder)
    relative: ClassVar[bool] = False
    # attention spans the unit supports; None: every span of SPANS, or "full" only for a unit
    # with its own attention (which then sees the layer's window / chunk itself)
    spans: ClassVar[tuple[str, ...] | None] = None

    def __init__(self, options: dict, *, d_model: int, num_heads: int, num_kv_heads: int,
                 head_dim: int, layer_index: int = 0, num_layers: int = 1, rngs: nnx.Rngs,
                 first: Encoding | None = None):
        for key, value in options.items():
            setattr(self, key, value)
        self.d_model, self.num_heads, self.num_kv_heads = d_model, num_heads, num_kv_heads
        self.head_dim, self.layer_index, self.num_layers = head_dim, layer_index, num_layers
        self.qk_dim = type(self).qk_head_dim(options, head_dim=head_dim)  # width of q, k after qk
        self.setup(rngs, first)

    # -- declaration ------------------------------------------------------------------
    def setup(self, rngs: nnx.Rngs, first: Encoding | None) -> None:
        """Create the unit's ``nnx.Param``s (called at the end of ``__init__``).

        ``first``: the model's first unit of this kind, or None if this is it.
        """

    @classmethod
    def check(cls, options: dict, *, prefix: str, head_dim: int, num_heads: int,
              num_layers: int) -> None:
        """Cross-field validation of the options (ValueError naming ``prefix.<field>``).

        Single fields are checked by their ``Option``; this sees all of them and
        the model's shapes. Runs once, when the config is validated.
        """

    @classmethod
    def unused_options(cls, options: dict) -> tuple[str, ...]:
        """Options the given configuration does not use (set one: an error)."""
        return ()

    @classmethod
    def attach_points(cls) -> tuple[str, ...]:
        """Where the unit touches attention, read off the protocol methods it overrides."""
        points = []
        for method, point in ATTACH_POINTS.items():
            if overrides(cls, method) and point not in points:
                points.append(point)
        return tuple(points)

    @classmethod
    def acts_at_input(cls) -> bool:
        """Adds a vector per position (or token) to the token embeddings (its layers are NoPE)."""
        return overrides(cls, "embed") or overrides(cls, "token_embed")

    @property
    def has_content_logits(self) -> bool:
        return overrides(type(self), "content_logits")

    @property
    def has_pair_logits(self) -> bool:
        """Whether attention takes ``scale q.k`` from :meth:`pair_logits` (an instance fact:
        RoPE has it only with a remapping)."""
        return overrides(type(self), "pair_logits")

    @property
    def has_values(self) -> bool:
        return overrides(type(self), "values")

    @property
    def has_feature_bias(self) -> bool:
        return overrides(type(self), "feature_bias")

    @classmethod
    def own_attention(cls) -> bool:
        """Computes its own attention weights (``attention``) instead of the softmax."""
        return overrides(cls, "attention")

    @classmethod
    def supported_spans(cls) -> tuple[str, ...]:
        """The attention spans (of :data:`SPANS`) a layer of this unit may have.

        ``spans`` when the unit declares it; otherwise every span for units
        that use the softmax of ``posenc.model.attention`` (which applies the
        span itself) and "full" only for units with their own ``attention``.
        """
        if cls.spans is not None:
            return tuple(cls.spans)
        return ("full",) if cls.own_attention() else SPANS

    @classmethod
    def check_span(cls, span: str, *, where: str = "", fields: str = "") -> None:
        """ValueError unless a layer of this unit may have ``span`` (:meth:`supported_spans`).

        The one rule: config validation (``posenc.model.layout``) and attention
        (``posenc.model.attention.attention``) both call it. ``where`` says
        what asked ("layer 3 has span 'window'"), ``fields`` the config fields to change.
        """
        allowed = cls.supported_spans()
        if span in allowed:
            return
        name = cls.name or cls.__qualname__
        what = "computes its own attention over" if cls.own_attention() else "supports"
        raise ValueError(f"{where or f'span {span!r}'}, but position kind {name!r} {what} spans "
                         f"{', '.join(allowed)} only" + (f" ({fields})" if fields else ""))

    @classmethod
    def has_kernel_form(cls) -> bool:
        """Whether the fused kernel can run the unit's attention (see ``kernel_terms``)."""
        if overrides(cls, "content_logits") or overrides(cls, "values"):
            return False
        if any(overrides(cls, m) for m in ("feature_bias", "attention", "output", "prepare")):
            return False  # data-dependent terms: the XLA path
        return overrides(cls, "kernel_terms") or not overrides(cls, "bias")

    @classmethod
    def position_axes(cls, options: dict) -> int:
        """How many position axes the unit reads (1: positions [B | 1, L]; A > 1: [B | 1, L, A])."""
        return 1

    @classmethod
    def longest_sequence(cls, options: dict) -> int | None:
        """The longest sequence the unit can encode with these options (None: no limit)."""
        return None

    @classmethod
    def own_qk_norm(cls, options: dict) -> str:
        """The option that makes the unit normalise q and k itself ("" when it does not).

        The model's QK-norm (``model.norm.qk_norm``) on such a layer would
        normalise twice: validation refuses it, naming this option.
        """
        return ""

    @classmethod
    def qk_head_dim(cls, options: dict, *, head_dim: int) -> int:
        """The width of the queries and keys after ``qk`` (``head_dim`` unless the unit widens them).

        Values, the attention output and the logit scale keep ``head_dim``; the
        model's QK-norm after the transform (``model.norm.qk_norm_after_rope``)
        has ``head_dim`` scales, so validation refuses it for a wider q and k.
        """
        return head_dim

    @classmethod
    def hides_keys(cls, options: dict) -> str:
        """The option that makes the unit's ``bias`` hide keys (-1e30 entries), or "" when it does not.

        Soft-capping the logits (``model.norm.attn_softcap``) would map those
        entries to ``-cap`` and let the keys through: validation refuses the pair,
        naming this option.
        """
        return ""

    @classmethod
    def rotates_in_attention(cls, options: dict) -> str:
        """The option that makes the unit rotate q and k per (query, key) pair inside
        attention (:meth:`pair_logits`), or "" when it does not.

        The model's QK-norm after the rotation (``model.norm.qk_norm_after_rope``)
        cannot follow such a rotation: validation refuses the pair, naming this option.
        """
        return ""

    @classmethod
    def counter_scales_qk(cls, options: dict) -> bool:
        """Whether ``qk`` scales queries and keys by reciprocal per-dimension factors that cancel only in
        ``q . k`` (xPos: zeta_i^((m - c) / scale_base) on a query at m, the inverse at a key at n).

        Such factors leave ``q . k`` a function of m - n only, whatever the common offset c the unit
        picks (xPos centres it between the queries and keys in a full forward and puts it at the
        query when decoding). A norm of the transformed q and k (placement ``ngpt``,
        ``model.norm.qk_norm_after_rope``) divides each by a length that does depend on c, so the
        logits would depend on an arbitrary choice, and cached decoding would differ from the full
        forward: validation refuses both.
        """
        return False

    @classmethod
    def layer_is_nope(cls, options: dict, *, layer_index: int, num_layers: int) -> bool:
        """Whether layer ``layer_index`` of this kind has no position term at all.

        Read by the per-layer rules "nope" / "positional" (QK-norm and logit
        scaling on some layers only, as Llama 4); iRoPE answers per layer.
        """
        return not cls.attach_points()

    # -- protocol ---------------------------------------------------------------------

    def embed(self, positions, dim):
        return None

    def token_embed(self, tokens, positions, dim, *, key=None, state=None):
        return self.embed(positions, dim), state

    def query(self, q, positions, *, seq_len):
        return q

    def key(self, k, positions, *, seq_len):
        return k

    def qk(self, q, k, q_positions, k_positions, *, seq_len):
        return (self.query(q, q_positions, seq_len=seq_len),
                self.key(k, k_positions, seq_len=seq_len))

    def static_key(self) -> bool:
        """Whether ``key`` depends on the key and its own position only (not on ``seq_len``, the
        queries or later tokens) and ``qk`` is ``query`` then ``key``: decoding then caches keys
        transformed once, when written, instead of transforming the whole cache at every step."""
        return False

    def bias(self, q_positions, k_positions):
        return None

    def content_logits(self, q, k, q_positions, k_positions, *, scale, q_offset):
        return None

    def pair_logits(self, q, k, q_positions, k_positions, *, scale):
        return None

    def values(self, weights, q_positions, k_positions):
        return None

    def kernel_terms(self, q_positions, k_positions):
        # No logit term at all (RoPE, NoPE): the kernel runs with none. A bias
        # without an override here has no in-kernel form.
        # Pair logits (a remapped RoPE) have no in-kernel form either.
        return () if type(self).has_kernel_form() and not self.has_pair_logits else None

    def constrain(self) -> None:
        """Project parameters into their domain (after each optimizer update)."""


def overrides(cls, method: str) -> bool:
    """Whether ``cls`` defines ``method`` differently from :class:`Encoding`."""
    return getattr(cls, method) is not getattr(Encoding, method)


class Rotation(Encoding):
    """A unit that transforms queries and keys alike, each by its own positions (:meth:`rotated`), so
    that keys are cached transformed (``static_key``): the multi-axis RoPE units."""

    def rotated(self, x, positions):
        """x [B, L, H, Dh] at ``positions`` -> transformed x."""
        raise NotImplementedError

    def query(self, q, positions, *, seq_len):
        return self.rotated(q, positions)

    def key(self, k, positions, *, seq_len):
        return self.rotated(k, positions)

    def static_key(self):
        return True
