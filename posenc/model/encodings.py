"""Position encodings as small NNX modules behind one protocol.

An encoding touches attention at up to four points (``posenc.registry``):

- ``embed(positions, dim)``: a vector per position added to the token
  embeddings (sinusoidal, learned); owned by the decoder, not by a layer;
- ``query(q, positions, seq_len=)`` / ``key(k, positions, seq_len=)``:
  rotate or scale queries and keys (RoPE family, xPos, iRoPE);
- ``bias(q_positions, k_positions)``: a logit bias from positions only
  (ALiBi, T5, KERPLE, FIRE), and ``content_logits(q, k, q_positions,
  k_positions, scale=, q_offset=)`` from content and positions (Shaw,
  Transformer-XL, CoPE; ``q_offset`` is the index of the first query among
  the keys); both are added to ``scale * q.k`` before soft-capping;
- ``values(weights, q_positions, k_positions)``: a term added to ``w @ v``
  (Shaw), linear in ``weights`` so the online softmax may rescale it.

Attention calls these methods and never branches on the kind. Parameters are
``nnx.Param``; the math is in the pure modules (``posenc.rope`` etc.). Each
layer owns its own encoding: T5 shares one table across layers (owned by
layer 0); here every layer has its own T5 table, the same convention as the
per-layer KERPLE, FIRE, Shaw, Transformer-XL and CoPE parameters.

``seq_len`` is the current sequence length (the static L of a forward call,
the cache length after appending in decoding); only the dynamic RoPE kinds
use it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

import posenc
from posenc import absolute, alibi, fire, kerple, registry, shaw, t5

DYNAMIC_SCALINGS = ("dynamic", "dynamic_yarn")  # frequencies depend on the current length


class Encoding(nnx.Module):
    """NoPE, and the protocol every encoding follows (all methods are no-ops)."""

    full_rows = False  # needs every key of a query row at once (CoPE's cumulative gates)
    has_content_logits = False  # content_logits is not None (rules out jax.nn.dot_product_attention)
    has_values = False  # values is not None
    depends_on_length = False  # query/key use seq_len (dynamic RoPE: the cache keeps raw keys)

    def __init__(self, cfg, *, num_heads, head_dim, layer_index=0, num_layers=1, rngs=None):
        self.num_heads, self.head_dim = num_heads, head_dim

    def check_length(self, length: int) -> None:
        """Raise ValueError if sequences of static length ``length`` are unsupported."""

    def embed(self, positions, dim):
        return None

    def query(self, q, positions, *, seq_len):
        return q

    def key(self, k, positions, *, seq_len):
        return k

    def bias(self, q_positions, k_positions):
        return None

    def content_logits(self, q, k, q_positions, k_positions, *, scale, q_offset):
        return None

    def values(self, weights, q_positions, k_positions):
        return None


class NoPE(Encoding):
    """No positional encoding: the causal mask alone carries order (Kazemnejad et al. 2023)."""


class Sinusoidal(Encoding):
    """Fixed sinusoidal absolute embedding (Vaswani et al. 2017), posenc.absolute.sinusoidal."""

    def __init__(self, cfg, **kw):
        super().__init__(cfg, **kw)
        self.layout = cfg.sinusoidal_layout

    def embed(self, positions, dim):
        return absolute.sinusoidal(positions, dim, layout=self.layout)


class Learned(Encoding):
    """Learned absolute table [max_length, D], GPT-2 init N(0, 0.02); no row past the table."""

    def __init__(self, cfg, *, d_model, rngs, **kw):
        super().__init__(cfg, **kw)
        self.max_length = int(cfg.max_length)
        self.table = nnx.Param(0.02 * jax.random.normal(rngs.params(), (self.max_length, d_model)))

    def check_length(self, length):
        if length > self.max_length:
            raise ValueError(
                f"sequence length {length} exceeds the learned position table "
                f"(model.position.max_length={self.max_length}); learned embeddings have no "
                "row past the table: raise max_length or choose another position kind")

    def embed(self, positions, dim):
        return absolute.learned(self.table[...], positions)


class RoPE(Encoding):
    """Rotary embedding (Su et al. 2021) with any posenc.rope.KINDS frequency scaling."""

    def __init__(self, cfg, **kw):
        super().__init__(cfg, **kw)
        self.scaling = cfg.scaling
        self.rotary_dim = posenc.rope.rotary_dim(self.head_dim, cfg.rotary_fraction)
        self.layout = cfg.rope_layout
        self.depends_on_length = self.scaling in DYNAMIC_SCALINGS
        self.freq_kw = dict(
            base=float(cfg.rope_base), factor=float(cfg.scaling_factor),
            original_length=int(cfg.original_length) or None, beta_fast=float(cfg.beta_fast),
            beta_slow=float(cfg.beta_slow), truncate=bool(cfg.yarn_truncate),
            low_freq_factor=float(cfg.low_freq_factor), high_freq_factor=float(cfg.high_freq_factor))
        # Build once so a bad scaling configuration fails at construction.
        self._frequencies(int(cfg.original_length) or 1)

    def _frequencies(self, seq_len):
        kw = dict(self.freq_kw, seq_len=seq_len) if self.depends_on_length else self.freq_kw
        return posenc.rope.frequencies(self.scaling, self.rotary_dim, **kw)

    def _rotate(self, x, positions, seq_len):
        inv_freq, factor = self._frequencies(seq_len)
        return posenc.rope.apply(x, positions, inv_freq, layout=self.layout,
                                 attention_factor=factor)

    def query(self, q, positions, *, seq_len):
        return self._rotate(q, positions, seq_len)

    def key(self, k, positions, *, seq_len):
        return self._rotate(k, positions, seq_len)


class IRoPE(RoPE):
    """Llama 4 iRoPE: RoPE, but every ``nope_every``-th layer is NoPE with query temperature."""

    def __init__(self, cfg, *, layer_index, num_layers, **kw):
        super().__init__(cfg, layer_index=layer_index, num_layers=num_layers, **kw)
        kinds = posenc.irope.layer_kinds(num_layers, nope_every=int(cfg.nope_every))
        self.nope = kinds[layer_index] == "nope"
        self.floor_scale, self.attn_scale = float(cfg.nope_floor_scale), float(cfg.nope_attn_scale)

    def query(self, q, positions, *, seq_len):
        if not self.nope:
            return super().query(q, positions, seq_len=seq_len)
        t = posenc.irope.nope_temperature(positions, floor_scale=self.floor_scale,
                                          attn_scale=self.attn_scale)
        return (q * t[..., None, None].astype(q.dtype)).astype(q.dtype)

    def key(self, k, positions, *, seq_len):
        return k if self.nope else super().key(k, positions, seq_len=seq_len)


class XPos(RoPE):
    """xPos (Sun et al. 2022): RoPE with per-pair exponential decay, queries up, keys down."""

    def __init__(self, cfg, **kw):
        super().__init__(cfg, **kw)
        self.scale_base = float(cfg.xpos_scale_base)

    def _xpos(self, x, positions, seq_len, is_key):
        inv_freq, _ = self._frequencies(seq_len)
        return posenc.xpos.apply(x, positions, inv_freq, is_key=is_key,
                                 scale_base=self.scale_base, layout=self.layout)

    def query(self, q, positions, *, seq_len):
        return self._xpos(q, positions, seq_len, False)

    def key(self, k, positions, *, seq_len):
        return self._xpos(k, positions, seq_len, True)


class ALiBi(Encoding):
    """Linear distance bias -slope_h (i - j) (Press et al. 2021); no parameters."""

    def bias(self, q_positions, k_positions):
        return alibi.bias(q_positions, k_positions, alibi.slopes(self.num_heads))


class T5(Encoding):
    """Bucketed learned relative bias (Raffel et al. 2020), table [num_buckets, H] per layer."""

    def __init__(self, cfg, *, d_model, rngs, **kw):
        super().__init__(cfg, **kw)
        self.max_distance = int(cfg.t5_max_distance)
        shape = (int(cfg.t5_num_buckets), self.num_heads)
        # HF T5 init: N(0, d_model^-1/2).
        self.table = nnx.Param(d_model ** -0.5 * jax.random.normal(rngs.params(), shape))

    def bias(self, q_positions, k_positions):
        return t5.bias(q_positions, k_positions, self.table[...], max_distance=self.max_distance)


class Kerple(Encoding):
    """KERPLE (Chi et al. 2022) log or power kernel; a, p per head, init U(0, 1) and U(0, 2)."""

    kernel = "log"

    def __init__(self, cfg, *, rngs, **kw):
        super().__init__(cfg, **kw)
        ka, kp = jax.random.split(rngs.params())
        self.a = nnx.Param(jax.random.uniform(ka, (self.num_heads,), minval=0.01, maxval=1.0))
        self.p = nnx.Param(jax.random.uniform(kp, (self.num_heads,), minval=0.01, maxval=2.0))

    def bias(self, q_positions, k_positions):
        return kerple.bias(q_positions, k_positions, self.a[...], self.p[...], kind=self.kernel)


class KerplePower(Kerple):
    kernel = "power"


class Fire(Encoding):
    """FIRE (Li et al. 2023): learned MLP of log-scaled normalised distance."""

    def __init__(self, cfg, *, rngs, **kw):
        super().__init__(cfg, **kw)
        params = fire.init_params(rngs.params(), self.num_heads, hidden=int(cfg.fire_hidden),
                                  c=float(cfg.fire_c), threshold=float(cfg.fire_threshold))
        self.params = nnx.Dict({n: nnx.Param(v) for n, v in params.items()})

    def bias(self, q_positions, k_positions):
        return fire.bias(q_positions, k_positions, {n: p[...] for n, p in self.params.items()})


class Shaw(Encoding):
    """Shaw et al. 2018: clipped relative key and value tables [2k + 1, Dh], shared by heads."""

    has_content_logits = True
    has_values = True

    def __init__(self, cfg, *, rngs, **kw):
        super().__init__(cfg, **kw)
        self.max_distance = int(cfg.shaw_max_distance)
        shape = (2 * self.max_distance + 1, self.head_dim)
        kk, kv = jax.random.split(rngs.params())
        std = self.head_dim ** -0.5
        self.table_k = nnx.Param(std * jax.random.normal(kk, shape))
        self.table_v = nnx.Param(std * jax.random.normal(kv, shape))

    def content_logits(self, q, k, q_positions, k_positions, *, scale, q_offset):
        # tensor2tensor scales q before both the content and the relative term.
        return shaw.logits(q * jnp.asarray(scale, q.dtype), self.table_k[...], q_positions,
                           k_positions, max_distance=self.max_distance)

    def values(self, weights, q_positions, k_positions):
        return shaw.values(weights, self.table_v[...], q_positions, k_positions,
                           max_distance=self.max_distance)


class TransformerXL(Encoding):
    """Transformer-XL relative terms u.k_j + (q_i + v).(W_r R_{i-j}) (Dai et al. 2019)."""

    has_content_logits = True

    def __init__(self, cfg, *, d_model, rngs, **kw):
        super().__init__(cfg, **kw)
        ku, kv, kw_ = jax.random.split(rngs.params(), 3)
        hd = (self.num_heads, self.head_dim)
        self.u = nnx.Param(0.02 * jax.random.normal(ku, hd))
        self.v = nnx.Param(0.02 * jax.random.normal(kv, hd))
        self.w_r = nnx.Param(d_model ** -0.5 * jax.random.normal(kw_, (d_model,) + hd))

    def content_logits(self, q, k, q_positions, k_positions, *, scale, q_offset):
        # The paper scales the whole score (a)+(b)+(c)+(d) by 1/sqrt(d).
        terms = posenc.transformer_xl.logits(q, k, q_positions, k_positions, u=self.u[...],
                                             v=self.v[...], w_r=self.w_r[...])
        return terms * scale


class CoPE(Encoding):
    """Contextual position encoding (Golovneva et al. 2024), embeddings [npos, Dh]."""

    has_content_logits = True
    full_rows = True

    def __init__(self, cfg, *, rngs, **kw):
        super().__init__(cfg, **kw)
        shape = (int(cfg.cope_npos), self.head_dim)
        self.embeddings = nnx.Param(self.head_dim ** -0.5 * jax.random.normal(rngs.params(), shape))

    def content_logits(self, q, k, q_positions, k_positions, *, scale, q_offset):
        # posenc.cope aligns the last query with the last key. Roll the keys so the
        # key of query 0 (index q_offset) sits at Lk - Lq, then roll the result back;
        # keys that wrap around are later than every query and are masked anyway.
        shift = k.shape[-3] - q.shape[-3] - q_offset
        k = jnp.roll(k, shift, axis=-3)
        terms = posenc.cope.logits(q, k, self.embeddings[...], causal=True)
        # The paper's code divides (q.k + this term) by sqrt(dh).
        return jnp.roll(terms, -shift, axis=-1) * scale


REGISTRY: dict[str, type[Encoding]] = {
    "nope": NoPE,
    "sinusoidal": Sinusoidal,
    "learned": Learned,
    "rope": RoPE,
    "irope": IRoPE,
    "xpos": XPos,
    "alibi": ALiBi,
    "t5": T5,
    "shaw": Shaw,
    "transformer_xl": TransformerXL,
    "kerple_log": Kerple,
    "kerple_power": KerplePower,
    "fire": Fire,
    "cope": CoPE,
}

# Constructor keywords beyond the common ones, per class.
_NEEDS_D_MODEL = (Learned, T5, TransformerXL)
_NEEDS_RNGS = (Learned, T5, Kerple, Fire, Shaw, TransformerXL, CoPE)


def is_embed_kind(kind: str) -> bool:
    """Whether ``kind`` acts at the input embedding (then its layers are NoPE)."""
    return "embed" in registry.attach_points(kind)


def build(kind, cfg, *, d_model, num_heads, head_dim, layer_index=0, num_layers=1, rngs):
    """Instantiate the encoding named ``kind`` (``cfg`` = config.model.position)."""
    cls = REGISTRY[registry.check_position_kind(kind)]
    kw = dict(num_heads=num_heads, head_dim=head_dim, layer_index=layer_index,
              num_layers=num_layers)
    if issubclass(cls, _NEEDS_D_MODEL):
        kw["d_model"] = d_model
    if issubclass(cls, _NEEDS_RNGS):
        kw["rngs"] = rngs
    return cls(cfg, **kw)


