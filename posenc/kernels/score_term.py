"""Score terms: what a position encoding adds to an attention logit, evaluated inside a kernel.

A :class:`Term` holds the encoding's arrays and a static function that turns
one (query block, key block) tile of positions into the additive logit term

    E[i, j] = fn(head, shared, q_pos[i], k_pos[j], q_vec[i], k_vec[j], **options)

for one head. The kernel (``posenc.kernels.flash``) evaluates every term of a
tuple on every tile it visits and adds them; it differentiates them with
``jax.vjp`` inside the backward kernels (arrays and per-query vectors in the
dq kernel, per-key vectors in the dk/dv kernel), so a new encoding adds a
term by writing ``fn`` only, from ops that lower on Triton and Mosaic TPU:
elementwise math, compares and selects, reductions over its own arrays,
small static loops; no gathers and no slicing of values (use :func:`pick`, a
masked reduction).

Arrays and the shapes ``fn`` sees (n, m are padded to powers of two; the
padding is zeros and must not change the result):

- ``head``: tuple of float32 ``[H, n]`` (one row per query head) -> ``[1, n]``
- ``shared``: tuple of float32 ``[m, n]`` (the same for every head) -> ``[m, n]``
- ``q_vec`` / ``k_vec``: optional float32 ``[B | 1, H, Lq]`` / ``[B | 1, H, Lk]``
  per-token values, ``None`` when absent
- ``q_pos`` / ``k_pos``: int32 positions.

The tile is formed by broadcasting the query side against the key side:
``q_pos``, ``q_vec`` are columns ``[bq, 1]`` and ``k_pos``, ``k_vec`` rows
``[1, bk]`` (result ``[bq, bk]``) in the forward and dq kernels; the dk/dv
kernel works on the transposed tile, passing rows ``[1, bq]`` and columns
``[bk, 1]`` (result ``[bk, bq]``). ``fn`` must therefore be elementwise in
the tile (it never reduces over or reshapes the tile axes), which every
relative-position bias is. Terms must be finite everywhere (also on masked
and padded entries, where the kernel discards them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Term:
    """One additive logit term: arrays (pytree leaves) and a static, hashable ``fn``.

    ``options`` is a tuple of (name, value) pairs passed to ``fn`` as keywords
    (static: part of the compiled kernel, so values must be hashable).
    """

    head: tuple = ()
    shared: tuple = ()
    q_vec: Any = None
    k_vec: Any = None
    fn: Callable = dataclasses.field(default=None, metadata=dict(static=True))
    options: tuple = dataclasses.field(default=(), metadata=dict(static=True))
    name: str = dataclasses.field(default="term", metadata=dict(static=True))

    def __call__(self, head, shared, q_pos, k_pos, q_vec, k_vec):
        return self.fn(head, shared, q_pos, k_pos, q_vec, k_vec, **dict(self.options))


def make(fn, *, head=(), shared=(), q_vec=None, k_vec=None, name="term", **options) -> Term:
    """Build a :class:`Term`; arrays are cast to float32 and checked for rank."""
    if not callable(fn):
        raise ValueError(f"fn must be callable; got {fn!r}")
    head = tuple(jnp.asarray(a, jnp.float32) for a in head)
    shared = tuple(jnp.asarray(a, jnp.float32) for a in shared)
    for kind, arrays in (("head", head), ("shared", shared)):
        for a in arrays:
            if a.ndim != 2:
                raise ValueError(f"{name}: {kind} arrays must be 2-d; got shape {a.shape}")
    for kind, vec in (("q_vec", q_vec), ("k_vec", k_vec)):
        if vec is not None and jnp.ndim(vec) != 3:
            raise ValueError(f"{name}: {kind} must have shape [B | 1, H, L]; got {jnp.shape(vec)}")
    q_vec = None if q_vec is None else jnp.asarray(q_vec, jnp.float32)
    k_vec = None if k_vec is None else jnp.asarray(k_vec, jnp.float32)
    return Term(head=head, shared=shared, q_vec=q_vec, k_vec=k_vec, fn=fn,
                options=tuple(sorted(options.items())), name=name)


def as_terms(score_terms) -> tuple[Term, ...]:
    """``None`` / a Term / a sequence of Terms -> tuple of Terms (ValueError otherwise)."""
    if score_terms is None:
        return ()
    if isinstance(score_terms, Term):
        return (score_terms,)
    terms = tuple(score_terms)
    for t in terms:
        if not isinstance(t, Term):
            raise ValueError(f"score_terms must be Terms from posenc.kernels.terms; got {t!r}")
    return terms


def check_heads(terms, num_heads: int, batch: int, lq: int, lk: int) -> None:
    """ValueError when a term's per-head rows or per-token vectors do not fit the attention."""
    for t in terms:
        for a in t.head:
            if a.shape[0] != num_heads:
                raise ValueError(f"{t.name}: head arrays need {num_heads} rows (one per query head);"
                                 f" got shape {a.shape}")
        for kind, vec, length in (("q_vec", t.q_vec, lq), ("k_vec", t.k_vec, lk)):
            if vec is not None and (vec.shape[0] not in (1, batch) or vec.shape[1:] != (num_heads, length)):
                raise ValueError(f"{t.name}: {kind} must have shape [{batch} or 1, {num_heads}, {length}];"
                                 f" got {vec.shape}")


# ---- helpers for term functions (values only; lower on Triton and Mosaic) ----

def pick(row, index: int):
    """``row[:, index]`` as ``[m, 1]`` by a masked lane reduction (no value slicing).

    Triton has no lowering for slices of register values; a select-and-sum
    does the same exactly (one non-zero term) and differentiates to a
    one-hot scatter.
    """
    lanes = jax.lax.broadcasted_iota(jnp.int32, row.shape, 1)
    return jnp.sum(jnp.where(lanes == index, row, 0.0), axis=1, keepdims=True)


def pick2(mat, r: int, c: int):
    """``mat[r, c]`` as ``[1, 1]`` (see :func:`pick`)."""
    col = pick(mat, c)  # [m, 1]
    rows = jax.lax.broadcasted_iota(jnp.int32, col.shape, 0)
    return jnp.sum(jnp.where(rows == r, col, 0.0), axis=0, keepdims=True)


def distance(q_pos, k_pos):
    """Signed ``q_pos - k_pos`` as int32 ``[bq, bk]``."""
    return q_pos.astype(jnp.int32) - k_pos.astype(jnp.int32)


def padded(x, axis: int):
    """Zero-pad ``axis`` of ``x`` to the next power of two (what the kernel's tiles need)."""
    n = x.shape[axis]
    size = 1 << max(0, n - 1).bit_length()
    if size == n:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, size - n)
    return jnp.pad(x, widths)


def dense(term: Term, q_positions, k_positions, *, num_heads: int | None = None) -> jax.Array:
    """The term on whole rows in plain JAX (no kernel): float32 ``[B | 1, H, Lq, Lk]``.

    Evaluates ``fn`` exactly as the kernel does (padded arrays, one head at a
    time, [Lq, 1] x [1, Lk] positions), e.g. for an XLA fallback or a test.
    Shapes: q_positions int [B | 1, Lq], k_positions int [B | 1, Lk]; ``num_heads``
    is read from the term's arrays unless it has none per head.
    """
    qp = jnp.asarray(q_positions, jnp.int32)
    kp = jnp.asarray(k_positions, jnp.int32)
    qp, kp = (p[None] if p.ndim == 1 else p for p in (qp, kp))
    head = tuple(padded(a, 1) for a in term.head)
    shared = tuple(padded(padded(a, 0), 1) for a in term.shared)
    batch = max(qp.shape[0], kp.shape[0], *(v.shape[0] for v in (term.q_vec, term.k_vec)
                                            if v is not None))
    if num_heads is None:
        sizes = [a.shape[0] for a in head] + [v.shape[1] for v in (term.q_vec, term.k_vec)
                                              if v is not None]
        if not sizes:
            raise ValueError(f"{term.name}: no per-head arrays; pass num_heads")
        num_heads = sizes[0]

    def one(b, h):
        rows = tuple(jax.lax.dynamic_slice_in_dim(a, h, 1, 0) for a in head)
        qv = None if term.q_vec is None else term.q_vec[b % term.q_vec.shape[0], h][:, None]
        kv = None if term.k_vec is None else term.k_vec[b % term.k_vec.shape[0], h][None, :]
        return term(rows, shared, qp[b % qp.shape[0]][:, None], kp[b % kp.shape[0]][None, :], qv, kv)

    heads = jax.vmap(one, in_axes=(None, 0))
    return jax.vmap(heads, in_axes=(0, None))(jnp.arange(batch), jnp.arange(num_heads)).astype(
        jnp.float32)


def total(terms, head, shared, q_pos, k_pos, q_vec, k_vec):
    """Sum of the terms on one tile; arguments are per-term tuples. -> [bq, bk] float32 or None."""
    out = None
    for t, h, s, qv, kv in zip(terms, head, shared, q_vec, k_vec):
        e = t(h, s, q_pos, k_pos, qv, kv).astype(jnp.float32)
        out = e if out is None else out + e
    return out
