"""The frozen call object of ``posenc.model.attention.attention``: everything but its arrays.

One :class:`AttentionCall` is built by the layer and handed unchanged to the
dense and blocked paths, the fused kernel's plan (``posenc.model.fused``)
and a unit's own ``attention`` hook, so a new term of a call changes this
one type instead of every signature on the way.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

IMPLS = ("auto", "dense", "blocked", "pallas")


def check_impl(impl: str) -> str:
    if impl not in IMPLS:
        raise ValueError(f"unknown attention_impl {impl!r}; choose one of: {', '.join(IMPLS)}")
    return impl


def _static(default):
    return jax.tree.static(default=default)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class AttentionCall:
    """What one ``posenc.model.attention.attention`` call does besides its arrays (q, k, v,
    positions, encoding).

    A frozen pytree: ``scale``, ``q_offset``, ``kv_length``, the features and
    ``sinks`` are leaves (they may be traced: a learned temperature, the cache
    length in decoding, per-token arrays, learned sinks); the rest is static (aux data), checked
    when the call is made.

    Fields:
      scale: multiplies q.k (1/sqrt(Dh), or a QK-norm temperature; float or traced scalar).
      q_offset: key index of the first query (0 in the full forward, the cache length when
        decoding; int or traced scalar).
      kv_length: number of valid keys (None: every key; traced in decoding).
      q_features, k_features: per-token features of the queries and keys from
        ``Encoding.prepare`` (dicts of [B, L, ...]; the keys' are ``cached_features`` only).
      causal: mask keys after the query (by index); False gives full attention.
      window, chunk: the layer's span (0 = off; at most one is set): keys with
        ``p - window < j`` / in the query's chunk of ``chunk`` keys (``posenc.model.attention``).
      softcap: 0 = off, else ``cap * tanh(s / cap)`` on the pre-mask logits.
      impl: "dense", "blocked", "pallas" (the fused kernel of posenc.model.fused; in the
        Pallas interpreter on CPU) or "auto": the fused kernel on GPU / TPU where it
        applies, else dense when Lq and Lk <= block, else blocked. Calls the kernel cannot
        run (statistics) take the "auto" choice; with "pallas", a unit without an
        in-kernel form is a ValueError.
      block: query / key block size of the blocked path.
      causal_block: dense path only: causal query blocks of this size attend to the keys
        up to their diagonal only (0 = one block; ``attention.dense_attention``).
      stats: also return ``max_attention_logit``, ``max_logit_per_head`` [H] and ``attention_entropy``.
      sinks: None, or float32 [H]: one sink logit per query head joining every row's softmax
        denominator (gpt-oss; ``posenc.learned_sinks``), in every path. Units with their own
        attention weights (``Encoding.attention``) refuse it.
    """

    scale: Any
    q_offset: Any = 0
    kv_length: Any = None
    q_features: dict = dataclasses.field(default_factory=dict)
    k_features: dict = dataclasses.field(default_factory=dict)
    causal: bool = _static(True)
    window: int = _static(0)
    chunk: int = _static(0)
    softcap: float = _static(0.0)
    impl: str = _static("auto")
    block: int = _static(512)
    causal_block: int = _static(0)
    stats: bool = _static(False)
    sinks: Any = None

    def __post_init__(self):
        check_impl(self.impl)
        for name in ("window", "chunk", "block", "causal_block"):
            value = getattr(self, name)
            if not is_static_int(value) or value < (1 if name == "block" else 0):
                raise ValueError(f"AttentionCall.{name} must be an int >= "
                                 f"{1 if name == 'block' else 0}; got {value!r}")
        if self.window and self.chunk:
            raise ValueError(f"a layer has one span: window={self.window} and chunk={self.chunk} "
                             "are both set")
        for name in ("causal", "stats"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"AttentionCall.{name} must be a bool; got {getattr(self, name)!r}")
        # None in a data field is an empty subtree: JAX transformations keep it as None.
        object.__setattr__(self, "q_features", dict(self.q_features or {}))
        object.__setattr__(self, "k_features", dict(self.k_features or {}))

    @property
    def span(self) -> str:
        """The layer's span: "full", "window" or "chunk" (``posenc.model.encoding.SPANS``)."""
        return "window" if self.window else "chunk" if self.chunk else "full"

    def replace(self, **changes) -> AttentionCall:
        """A copy with ``changes`` (checked like a new call)."""
        return dataclasses.replace(self, **changes)

    def num_keys(self, lk: int):
        """The number of valid keys among ``lk`` slots (``kv_length``, or ``lk``)."""
        return lk if self.kv_length is None else self.kv_length

    def reads_cache(self, lq: int, lk: int) -> bool:
        """Whether the queries read a cache (decoding) rather than being the keys themselves
        (the full forward: ``q_offset`` 0, ``kv_length`` unset or ``Lk``, and ``Lq == Lk``)."""
        full = (is_static_int(self.q_offset) and self.q_offset == 0 and lq == lk
                and (self.kv_length is None
                     or (is_static_int(self.kv_length) and self.kv_length == lk)))
        return not full

    def runs_blocked(self, lq: int, lk: int) -> bool:
        """Whether the XLA path is blocked for Lq queries and Lk keys (impl "blocked", or
        "auto" / "pallas" falling back, with more than ``block`` queries or keys)."""
        return self.impl == "blocked" or (self.impl != "dense" and max(lq, lk) > self.block)


def is_static_int(x) -> bool:
    """A Python int (not a bool, not traced): usable for static slicing."""
    return isinstance(x, int) and not isinstance(x, bool)
