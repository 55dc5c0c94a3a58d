"""Mamba-2's state-space duality (SSD) scan: chunked and step by step.

Dao & Gu 2024, "Transformers are SSMs: Generalized Models and Efficient
Algorithms Through Structured State Space Duality" (ICML 2024, arXiv
2405.21060). Official code: state-spaces/mamba
(``mamba_ssm/modules/ssd_minimal.py``); the reference for exactness here is
transformers 5.x's pure-torch path, ``models/mamba2/modeling_mamba2.py``:
``mamba2_chunk_scan`` (the chunked scan of ``Mamba2Mixer``, formerly inside
``torch_forward``), ``mamba2_selective_state_update`` (one decoding step),
``segment_sum`` and ``MambaRMSNormGated``. The same mixer runs in Bamba,
Granite 4.0-H (granitemoehybrid), Nemotron-H (with a group-wise gated norm,
``Zamba2RMSNormGated``) and Falcon-H1.

Per head h with a scalar decay ``A_h < 0`` (``A = -exp(A_log)``), step size
``dt_t > 0`` (:func:`time_step`), input ``x_t`` [P] and ``B_t, C_t`` [N]
shared by the heads of a group (``n_groups`` G; head h reads group
``h // (H / G)``, as ``repeat_interleave``)::

    S_t = exp(dt_t A) S_{t-1} + dt_t x_t B_t^T          S [P, N]
    y_t = S_t C_t + D x_t

The chunked form (chunks of ``chunk_size`` tokens) computes the same outputs
as a masked quadratic form inside each chunk, ``Y_diag = (C B^T o L) (dt x)``
with ``L_ij = exp(sum_{k=j+1..i} dt_k A)`` (:func:`segment_sum`), plus the
state at each chunk's start read through ``C`` (``Y_off``); the states pass
from chunk to chunk by a scan (transformers' inter-chunk ``segment_sum``
over all chunks is the same recurrence, unrolled). Lengths that are not a
multiple of the chunk are padded with ``dt = 0`` (no decay, no input), so
the final state is exact.

State layout ``[..., H, P, N]`` (transformers' ``recurrent_states``
``[B, num_heads, head_dim, state_size]``), float32.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from posenc import checks
from posenc.recurrent._common import F32, check_heads, einsum, from_chunks, to_chunks
from posenc.recurrent._common import gated_rms_norm as _gated_rms_norm


def time_step(dt, dt_bias, *, limit=(0.0, math.inf)) -> jax.Array:
    """Mamba-2's step size ``clamp(softplus(dt + dt_bias), *limit)`` in float32.

    ``dt`` is the mixer's projection (the last ``num_heads`` channels of
    ``in_proj``), ``dt_bias`` its learned bias, ``limit`` the config's
    ``time_step_limit`` (default no clamp).

    Shapes: dt [..., L, H], dt_bias [H] -> float32 [..., L, H].
    """
    lo, hi = (float(v) for v in limit)
    if not lo <= hi:
        raise ValueError(f"limit must be (low, high) with low <= high; got {limit}")
    dt = jnp.asarray(dt).astype(F32) + jnp.asarray(dt_bias).astype(F32)
    return jnp.clip(jax.nn.softplus(dt), lo, hi)


def segment_sum(a) -> jax.Array:
    """``out[..., i, j] = sum_{k=j+1..i} a[..., k]`` for ``j <= i``, ``-inf`` above the diagonal.

    transformers' ``segment_sum``: a cumulative sum of the masked,
    repeated input (not a difference of cumulative sums, which loses
    precision when the sums are large). float32.

    Shapes: a [..., C] -> [..., C, C].
    """
    a = jnp.asarray(a).astype(F32)
    c = a.shape[-1]
    strict = jnp.tril(jnp.ones((c, c), bool), -1)
    rep = jnp.where(strict, a[..., :, None], 0.0)
    out = jnp.cumsum(rep, axis=-2)
    return jnp.where(jnp.tril(jnp.ones((c, c), bool)), out, -jnp.inf)


def _check(x, dt, a, b, c, d, state, *, token_axis: bool):
    lead = 3 if token_axis else 2
    x = jnp.asarray(x)
    if x.ndim < lead:
        raise ValueError(f"x must have shape [..., {'L, ' if token_axis else ''}H, P]; got {x.shape}")
    h, p = x.shape[-2:]
    tok = x.shape[-3:-2]
    dt, a, b, c = (jnp.asarray(v) for v in (dt, a, b, c))
    if dt.shape[-len(tok) - 1:] != tok + (h,):
        raise ValueError(f"dt must have shape [..., {'L, ' if token_axis else ''}H] = {tok + (h,)}; got {dt.shape}")
    if a.shape != (h,):
        raise ValueError(f"A must have shape [H] = [{h}]; got {a.shape}")
    if b.ndim < 2 or b.shape[-len(tok) - 2:-2] != tok or b.shape != c.shape:
        raise ValueError(f"B and C must have shape [..., {'L, ' if token_axis else ''}G, N]; "
                         f"got {b.shape} and {c.shape}")
    rep = check_heads("ssd", h, b.shape[-2])
    if d is not None and jnp.shape(d) != (h,):
        raise ValueError(f"D must have shape [H] = [{h}]; got {jnp.shape(d)}")
    if state is not None and jnp.shape(state)[-3:] != (h, p, b.shape[-1]):
        raise ValueError(f"state must have shape [..., H, P, N] = [..., {h}, {p}, {b.shape[-1]}]; "
                         f"got {jnp.shape(state)}")
    return x, dt.astype(F32), a.astype(F32), b.astype(F32), c.astype(F32), rep


def _initial(state, batch, h, p, n):
    if state is None:
        return jnp.zeros(batch + (h, p, n), F32)
    return jnp.broadcast_to(jnp.asarray(state).astype(F32), batch + (h, p, n))


@functools.partial(jax.jit, static_argnames=("chunk", "rep"))
def _chunked(x, dt, a, b, c, D, initial_state, *, chunk, rep):
    length, h, p = x.shape[-3:]
    n = b.shape[-1]
    batch = jnp.broadcast_shapes(x.shape[:-3], dt.shape[:-2], b.shape[:-3], c.shape[:-3])
    x32 = x.astype(F32)
    bh, ch = jnp.repeat(b, rep, axis=-2), jnp.repeat(c, rep, axis=-2)   # [..., L, H, N]
    xdt = to_chunks(x32 * dt[..., None], chunk, -3)                     # [..., Nc, C, H, P]
    bh, ch = to_chunks(bh, chunk, -3), to_chunks(ch, chunk, -3)         # [..., Nc, C, H, N]
    adt = jnp.swapaxes(to_chunks(dt * a, chunk, -2), -1, -2)            # [..., Nc, H, C]
    acum = jnp.cumsum(adt, axis=-1)

    # 1. inside each chunk: (C B^T o L) (dt x)
    decay = jnp.exp(segment_sum(adt))                                   # [..., Nc, H, C, C]
    scores = einsum("...lhn,...shn->...hls", ch, bh) * decay
    y_diag = einsum("...hls,...shp->...lhp", scores, xdt)
    # 2. each chunk's own contribution to the state at its end
    to_end = jnp.exp(acum[..., -1:] - acum)                             # [..., Nc, H, C]
    own = einsum("...lhn,...hl,...lhp->...hpn", bh, to_end, xdt)        # [..., Nc, H, P, N]
    # 3. the states at the chunk starts, chunk after chunk
    whole = jnp.exp(acum[..., -1])                                      # [..., Nc, H]
    own = jnp.broadcast_to(own, batch + own.shape[-4:])
    whole = jnp.broadcast_to(whole, batch + whole.shape[-2:])

    def carry(s, inputs):
        w, o = inputs
        return s * w[..., None, None] + o, s

    final, starts = jax.lax.scan(carry, _initial(initial_state, batch, h, p, n),
                                 (jnp.moveaxis(whole, -2, 0), jnp.moveaxis(own, -4, 0)))
    starts = jnp.moveaxis(starts, 0, -4)                                # [..., Nc, H, P, N]
    # 4. the start state read through C, decayed to each token
    y_off = einsum("...lhn,...hpn,...hl->...lhp", ch, starts, jnp.exp(acum))
    y = from_chunks(y_diag + y_off, length, -4)
    if D is not None:
        y = y + jnp.asarray(D).astype(F32)[:, None] * x32
    return y, final


def chunked(x, dt, A, B, C, *, chunk_size=256, D=None, initial_state=None) -> tuple[jax.Array, jax.Array]:
    """The SSD scan by chunks: ``(y, final_state)``, equal to :func:`recurrent`.

    transformers' ``mamba2_chunk_scan`` with ``dt`` already through
    :func:`time_step` (its ``dt_bias``, ``dt_softplus``, ``dt_limit``), ``z``
    None and ``return_final_states``: segment sums, the intra-chunk
    quadratic form, the inter-chunk state passing and the ``D`` skip.
    ``initial_state`` continues a sequence (a cache; default zeros). float32
    math; ``y`` in ``x.dtype``, the state float32. Memory O(L chunk H) for the
    intra-chunk decays.

    Shapes: x [..., L, H, P], dt [..., L, H] (> 0), A [H] (< 0), B, C
    [..., L, G, N], D [H], initial_state [..., H, P, N]
    -> (y [..., L, H, P], state float32 [..., H, P, N]).
    """
    chunk = checks.integer("chunk_size", chunk_size, minimum=1)
    x, dt, a, b, c, rep = _check(x, dt, A, B, C, D, initial_state, token_axis=True)
    chunk = min(chunk, max(1, x.shape[-3]))  # a sequence shorter than a chunk: one chunk of it, not padded
    y, final = _chunked(x, dt, a, b, c, D, initial_state, chunk=chunk, rep=rep)
    return y.astype(x.dtype), final


@functools.partial(jax.jit, static_argnames=("rep",))
def _step(x, dt, a, b, c, state, D, *, rep):
    x32 = x.astype(F32)
    bh, ch = jnp.repeat(b, rep, axis=-2), jnp.repeat(c, rep, axis=-2)   # [..., H, N]
    decay = jnp.exp(dt * a)[..., None, None]
    new = jnp.asarray(state).astype(F32) * decay + (dt[..., None] * x32)[..., :, None] * bh[..., None, :]
    y = einsum("...hpn,...hn->...hp", new, ch)
    if D is not None:
        y = y + jnp.asarray(D).astype(F32)[:, None] * x32
    return y, new


def step(x, dt, A, B, C, state, *, D=None) -> tuple[jax.Array, jax.Array]:
    """One decoding step of the SSD recurrence: ``(y, new_state)``.

    transformers' ``mamba2_selective_state_update`` with ``dt`` already
    through :func:`time_step`: ``S' = exp(dt A) S + dt x B^T``,
    ``y = S' C + D x``. float32 math; ``y`` in ``x.dtype``, the state float32.

    Shapes: x [..., H, P], dt [..., H], A [H], B, C [..., G, N], D [H],
    state [..., H, P, N] -> (y [..., H, P], float32 [..., H, P, N]).
    """
    x, dt, a, b, c, rep = _check(x, dt, A, B, C, D, state, token_axis=False)
    y, new = _step(x, dt, a, b, c, state, D, rep=rep)
    return y.astype(x.dtype), new


@functools.partial(jax.jit, static_argnames=("rep",))
def _recurrent(x, dt, a, b, c, D, initial_state, *, rep):
    h, p = x.shape[-2:]
    batch = jnp.broadcast_shapes(x.shape[:-3], dt.shape[:-2], b.shape[:-3], c.shape[:-3])

    def one(s, inputs):
        xt, dtt, bt, ct = inputs
        y, s = _step(xt, dtt, a, bt, ct, s, D, rep=rep)
        return s, y

    t = len(batch)  # the token axis, after broadcasting to the common batch shape
    xs = tuple(jnp.moveaxis(jnp.broadcast_to(v, batch + v.shape[v.ndim - k:]), t, 0)
               for v, k in ((x, 3), (dt, 2), (b, 3), (c, 3)))
    final, ys = jax.lax.scan(one, _initial(initial_state, batch, h, p, b.shape[-1]), xs)
    return jnp.moveaxis(ys, 0, -3), final


def recurrent(x, dt, A, B, C, *, D=None, initial_state=None) -> tuple[jax.Array, jax.Array]:
    """The SSD recurrence token by token (a scan of :func:`step`): ``(y, final_state)``.

    Shapes as :func:`chunked`.
    """
    x, dt, a, b, c, rep = _check(x, dt, A, B, C, D, initial_state, token_axis=True)
    y, final = _recurrent(x, dt, a, b, c, D, initial_state, rep=rep)
    return y.astype(x.dtype), final


def gated_rms_norm(x, gate, weight, *, eps=1e-6, group_size=None) -> jax.Array:
    """Mamba-2's output norm: ``weight * rms_norm(x * silu(gate))`` (gate before the norm).

    transformers' ``MambaRMSNormGated`` (Mamba-2, Bamba, Granite 4.0-H:
    the norm over all of ``intermediate_size``); with ``group_size``, per
    group of that many channels (``Zamba2RMSNormGated`` of Nemotron-H and
    Zamba2, ``group_size = intermediate_size // n_groups``; mamba_ssm's
    ``RMSNormGated(norm_before_gate=False)``). ``gate`` None: no gate.
    float32 math, output in ``x.dtype``.

    Shapes: x [..., D], gate [..., D], weight [D] -> like x.
    """
    return _gated_rms_norm(x, gate, weight, eps=eps, activation="silu", norm_before_gate=False,
                           group_size=group_size)


def split_projection(zxbcdt, *, num_heads, head_dim, n_groups, state_size):
    """Split Mamba-2's ``in_proj`` output into ``(gate, xBC, dt)``.

    transformers 5.x ``Mamba2Mixer``: ``projected_states.split([intermediate_size,
    conv_dim, num_heads])`` with ``intermediate_size = H P`` and ``conv_dim =
    H P + 2 G N`` (older checkpoints' zero-width ``d_mlp`` parts are absent).
    ``xBC`` goes through the short convolution (``posenc.short_conv``, SiLU),
    then :func:`split_xbc`.

    Shapes: zxbcdt [..., L, 2 H P + 2 G N + H] -> ([..., L, H P], [..., L, H P + 2 G N], [..., L, H]).
    """
    h = checks.integer("num_heads", num_heads, minimum=1)
    p = checks.integer("head_dim", head_dim, minimum=1)
    g = checks.integer("n_groups", n_groups, minimum=1)
    n = checks.integer("state_size", state_size, minimum=1)
    zxbcdt = jnp.asarray(zxbcdt)
    inner, conv_dim = h * p, h * p + 2 * g * n
    if zxbcdt.shape[-1] != inner + conv_dim + h:
        raise ValueError(f"zxbcdt must end in 2 H P + 2 G N + H = {inner + conv_dim + h}; got {zxbcdt.shape}")
    return zxbcdt[..., :inner], zxbcdt[..., inner:inner + conv_dim], zxbcdt[..., inner + conv_dim:]


def split_xbc(xbc, *, num_heads, head_dim, n_groups, state_size):
    """Split the convolved ``xBC`` into ``x`` by heads and ``B``, ``C`` by groups.

    transformers: ``torch.split(hidden_states_B_C, [H P, G N, G N])``, then
    ``x.view(..., H, P)``, ``B.view(..., G, N)``, ``C.view(..., G, N)``.

    Shapes: xbc [..., L, H P + 2 G N] -> (x [..., L, H, P], B [..., L, G, N], C [..., L, G, N]).
    """
    h = checks.integer("num_heads", num_heads, minimum=1)
    p = checks.integer("head_dim", head_dim, minimum=1)
    g = checks.integer("n_groups", n_groups, minimum=1)
    n = checks.integer("state_size", state_size, minimum=1)
    xbc = jnp.asarray(xbc)
    if xbc.shape[-1] != h * p + 2 * g * n:
        raise ValueError(f"xbc must end in H P + 2 G N = {h * p + 2 * g * n}; got {xbc.shape}")
    lead = xbc.shape[:-1]
    x = xbc[..., :h * p].reshape(lead + (h, p))
    b = xbc[..., h * p:h * p + g * n].reshape(lead + (g, n))
    c = xbc[..., h * p + g * n:].reshape(lead + (g, n))
    return x, b, c
