"""Fused flash attention (Pallas) with position terms computed inside the kernel.

Dao et al. 2022/2023, FlashAttention(-2): online softmax over key blocks,

    s_ij = softcap(scale q_i . k_j + sum_t E^t_ij),   o_i = sum_j softmax_j(s_ij) v_j,

where each E^t is a :class:`posenc.kernels.score_term.Term` (ALiBi, T5, KERPLE,
FIRE, FoX, or your own) evaluated per tile from the block's positions, so no
[L, L] bias ever exists. Forward and backward are Pallas kernels under a
custom VJP: the forward saves the output and the row log-sum-exp; the
backward kernels recompute the logits, and differentiate the terms inside
the dq kernel (arrays, per-query vectors) and the dk/dv kernel (per-key
vectors). Masks are by index: key j is visible to query i iff j < kv_length
and (causal) j <= q_offset + i and (window W) q_offset + i - W < j and
(chunk C) (q_offset + i) // C == j // C. A query with no visible key gets
output 0 and zero gradients.

Backends: Triton on GPU, Mosaic on TPU, the Pallas interpreter elsewhere
(``interpret=None`` picks it on CPU; ``interpret=True`` forces it).
:func:`supported` says whether a call can run, so callers can fall back to
``posenc.model.attention`` (XLA blocked) otherwise.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
# Imported up front although only used for compiled kernels: the interpreter
# imports the TPU module lazily on first use, which registers config state and
# changes the trace context, so the first jitted call would be traced twice.
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import triton as plgpu

from posenc import checks
from posenc.kernels import flash_kernels as fk
from posenc.kernels import score_term

BACKENDS = ("gpu", "tpu")
DEFAULT_BLOCKS = {"gpu": (64, 64), "tpu": (128, 128), None: (64, 64)}
MIN_BLOCK = {"gpu": 16, "tpu": 8, None: 8}  # Triton's dot needs tiles of >= 16
TPU_VMEM_BUDGET = 12 * 2 ** 20  # bytes of whole-sequence blocks per program (v5e scoped default 16 MiB)


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _is_tracer(x) -> bool:
    return isinstance(x, jax.core.Tracer)


def resolve_backend(backend=None, interpret=None):
    """(backend, interpret) after defaults: interpret on CPU; backend from the default device."""
    if backend is not None:
        backend = checks.choice("backend", backend, BACKENDS)
    platform = jax.default_backend()
    if interpret is None:
        interpret = platform == "cpu"
    elif not isinstance(interpret, bool) and type(interpret).__name__ not in (
            "InterpretParams", "InterpretGPUParams"):
        raise ValueError(f"interpret must be None, True, False or a Pallas InterpretParams; got {interpret!r}")
    if backend is None and not interpret:
        backend = {"gpu": "gpu", "cuda": "gpu", "rocm": "gpu", "tpu": "tpu"}.get(platform)
        if backend is None:
            raise ValueError(f"no Pallas backend for platform {platform!r}; use interpret=True "
                             f"or one of: {', '.join(BACKENDS)}")
    return backend, interpret


def _blocks(block_q, block_k, lq, lk, backend):
    dq, dk = DEFAULT_BLOCKS[backend]
    out = []
    for name, b, default, length in (("block_q", block_q, dq, lq), ("block_k", block_k, dk, lk)):
        b = default if b is None else checks.integer(name, b, minimum=1)
        if b & (b - 1):
            raise ValueError(f"{name} must be a power of two; got {b}")
        out.append(max(min(b, _pow2(length)), MIN_BLOCK[backend]))
    return tuple(out)


def supported(q_shape, k_shape, *, dtype=jnp.float32, score_terms=(), block_q=None, block_k=None,
              backend=None, interpret=None) -> tuple[bool, str]:
    """Whether :func:`flash_attention` can run this call; ``(ok, reason)`` (reason "" when ok).

    Checks what the kernel needs, per backend: dtype float32 / bfloat16, GQA
    (H % K == 0), equal head dims, and on TPU that the whole-sequence blocks of
    one program (K and V of a kv head; q and do of its query heads in the
    dk/dv kernel) fit ``TPU_VMEM_BUDGET``. CoPE and Shaw (content-dependent
    terms) have no kernel term; callers keep the XLA path for them.
    """
    try:
        backend, interpret = resolve_backend(backend, interpret)
    except ValueError as e:
        return False, str(e)
    if len(q_shape) != 4 or len(k_shape) != 4:
        return False, f"q and k must be [B, L, H, Dh]; got {q_shape} and {k_shape}"
    b, lq, h, d = q_shape
    bk_, lk, kh, dk = k_shape
    if bk_ != b or dk != d:
        return False, f"q {q_shape} and k {k_shape} differ in batch or head dim"
    if kh < 1 or h % kh:
        return False, f"num_heads {h} is not a multiple of num_kv_heads {kh}"
    if jnp.dtype(dtype) not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16)):
        return False, f"dtype {jnp.dtype(dtype)} is not float32 or bfloat16"
    try:
        terms = score_term.as_terms(score_terms)
        bq, bk = _blocks(block_q, block_k, lq, lk, backend)
    except ValueError as e:
        return False, str(e)
    if backend == "tpu" and not interpret:
        item = jnp.dtype(dtype).itemsize
        lqp, lkp = -(-lq // bq) * bq, -(-lk // bk) * bk
        fwd = 2 * 2 * lkp * d * item  # K and V of one kv head, double-buffered
        dkv = 2 * 2 * (h // kh) * lqp * d * item  # q and do of a kv head's query heads
        if max(fwd, dkv) > TPU_VMEM_BUDGET:
            return False, (f"sequence too long for whole-sequence VMEM blocks on TPU "
                           f"({max(fwd, dkv)} bytes > {TPU_VMEM_BUDGET})")
    return True, ""


def _check_int_or_traced(name, value, minimum, maximum=None):
    """Concrete integers are range-checked; traced scalars pass (never inspected)."""
    if value is None or _is_tracer(value):
        return value
    if isinstance(value, jax.Array) and value.ndim == 0 and jnp.issubdtype(value.dtype, jnp.integer):
        value = int(value)
    return checks.integer(name, value, minimum=minimum, maximum=maximum)


def _check_positions(name, pos, batch, length):
    pos = jnp.asarray(pos)
    if not jnp.issubdtype(pos.dtype, jnp.integer):
        raise ValueError(f"{name} must be an integer array; got dtype {pos.dtype}")
    if pos.ndim == 1:
        pos = pos[None]
    if pos.ndim != 2 or pos.shape[0] not in (1, batch) or pos.shape[1] != length:
        raise ValueError(f"{name} must have shape [{batch} or 1, {length}]; got {pos.shape}")
    return pos.astype(jnp.int32)


def _pad_to(x, axis, size):
    pad = size - x.shape[axis]
    if pad == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, pad)
    return jnp.pad(x, widths)


def flash_attention(q, k, v, *, q_positions, k_positions, score_terms=(), scale, causal=True,
                    q_offset=0, kv_length=None, window=None, chunk=None, softcap=0.0,
                    block_q=None, block_k=None, interpret=None, backend=None):
    """Fused attention with in-kernel position terms (see module doc).

    Args:
      q: [B, Lq, H, Dh]; k, v: [B, Lk, K, Dh] with H % K == 0 (GQA, k/v never repeated).
      q_positions, k_positions: int [B or 1, Lq], [B or 1, Lk] (read by the terms only).
      score_terms: a Term or a sequence of Terms from ``posenc.kernels.terms`` (summed).
      scale: static float multiplying q.k (fold a learned temperature into q).
      causal, window, chunk, kv_length, q_offset: masks by index (module doc); q_offset
        and kv_length may be traced scalars.
      softcap: 0 = off, else ``cap * tanh(s / cap)`` on the pre-mask logit.
      block_q, block_k: powers of two (default 64 on GPU, 128 on TPU), clipped to the lengths.
      interpret: None = Pallas interpreter on CPU only; True forces it (any Pallas
        InterpretParams is passed through).
      backend: "gpu" (Triton) | "tpu" (Mosaic) | None = from the default device.
    Returns:
      [B, Lq, H, Dh] in q.dtype.
    """
    q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
    if q.ndim != 4 or k.ndim != 4 or v.shape != k.shape:
        raise ValueError(f"q must be [B, Lq, H, Dh] and k, v [B, Lk, K, Dh]; got {q.shape}, "
                         f"{k.shape}, {v.shape}")
    B, Lq, H, Dh = q.shape
    Lk, K = k.shape[1], k.shape[2]
    if k.shape[0] != B or k.shape[3] != Dh:
        raise ValueError(f"k {k.shape} must match q {q.shape} in batch and head dim")
    if H % K:
        raise ValueError(f"num_heads {H} is not a multiple of num_kv_heads {K}")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (jnp.float32, jnp.bfloat16):
        raise ValueError(f"q, k, v must share a dtype in (float32, bfloat16); got {q.dtype}, "
                         f"{k.dtype}, {v.dtype}")
    if _is_tracer(scale):
        raise ValueError("scale must be a static float; multiply q by a learned temperature instead")
    scale = checks.number("scale", scale)
    causal = checks.boolean("causal", causal)
    softcap = checks.number("softcap", softcap, minimum=0.0)
    window = None if window is None else checks.integer("window", window, minimum=1)
    chunk = None if chunk is None else checks.integer("chunk", chunk, minimum=1)
    q_offset = _check_int_or_traced("q_offset", q_offset, 0)
    kv_length = _check_int_or_traced("kv_length", kv_length, 0, Lk)
    q_positions = _check_positions("q_positions", q_positions, B, Lq)
    k_positions = _check_positions("k_positions", k_positions, B, Lk)
    terms = score_term.as_terms(score_terms)
    score_term.check_heads(terms, H, B, Lq, Lk)
    backend, interpret = resolve_backend(backend, interpret)
    bq, bk = _blocks(block_q, block_k, Lq, Lk, backend)
    nq, nk = -(-Lq // bq), -(-Lk // bk)
    lqp, lkp = nq * bq, nk * bk
    dhp = max(_pow2(Dh), 16) if backend == "gpu" else Dh  # Triton tiles are powers of two

    # Kernel layouts (see posenc.kernels.flash_kernels): heads before tokens, padded.
    qt = _pad_to(_pad_to(jnp.swapaxes(q, 1, 2), 2, lqp), 3, dhp)
    kt = _pad_to(_pad_to(jnp.swapaxes(k, 1, 2), 2, lkp), 3, dhp)
    vt = _pad_to(_pad_to(jnp.swapaxes(v, 1, 2), 2, lkp), 3, dhp)
    qpos = _pad_to(q_positions, 1, lqp)[:, :, None]
    kpos = _pad_to(k_positions, 1, lkp).reshape(-1, nk, bk)
    kv_len = Lk if kv_length is None else jnp.minimum(kv_length, Lk)
    scal = jnp.stack([jnp.asarray(q_offset, jnp.int32), jnp.asarray(kv_len, jnp.int32)])
    arrays, skeleton = [], []
    for t in terms:
        head = tuple(score_term.padded(a, 1)[:, None, :] for a in t.head)
        shared = tuple(score_term.padded(score_term.padded(a, 0), 1) for a in t.shared)
        qv = None if t.q_vec is None else _pad_to(
            jnp.broadcast_to(t.q_vec, (B, H, Lq)), 2, lqp)[..., None]
        kv = None if t.k_vec is None else _pad_to(
            jnp.broadcast_to(t.k_vec, (B, H, Lk)), 2, lkp).reshape(B, H, nk, bk)
        arrays.append((head, shared, qv, kv))
        bare = score_term.Term(fn=t.fn, options=t.options, name=t.name)
        skeleton.append((bare, len(head), len(shared), qv is not None, kv is not None))
    cfg = fk.Config(scale=scale, causal=causal, window=window, chunk=chunk, softcap=softcap,
                    block_q=bq, block_k=bk, groups=H // K, batch_pos=q_positions.shape[0] > 1
                    or k_positions.shape[0] > 1, terms=tuple(skeleton), interpret=interpret,
                    backend=backend)
    if cfg.batch_pos:
        qpos = jnp.broadcast_to(qpos, (B,) + qpos.shape[1:])
        kpos = jnp.broadcast_to(kpos, (B,) + kpos.shape[1:])
    out = _flash(cfg, qt, kt, vt, qpos, kpos, scal, tuple(arrays))
    return jnp.swapaxes(out[:, :, :Lq, :Dh], 1, 2)


# ---------------------------------------------------------------- custom VJP

@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _flash(cfg, q, k, v, qpos, kpos, scal, arrays):
    return _forward(cfg, q, k, v, qpos, kpos, scal, arrays)[0]


def _flash_fwd(cfg, q, k, v, qpos, kpos, scal, arrays):
    o, lse = _forward(cfg, q, k, v, qpos, kpos, scal, arrays)
    return o, (q, k, v, qpos, kpos, scal, arrays, o, lse)


def _flash_bwd(cfg, res, do):
    q, k, v, qpos, kpos, scal, arrays, o, lse = res
    do = do.astype(q.dtype)
    delta = jnp.sum(o.astype(jnp.float32) * do.astype(jnp.float32), axis=-1, keepdims=True)
    dq, term_grads = _backward_dq(cfg, q, k, v, qpos, kpos, scal, arrays, do, lse, delta)
    dk, dv, dkvecs = _backward_dkv(cfg, q, k, v, qpos, kpos, scal, arrays, do, lse, delta)
    grads = []
    kvec_it = iter(dkvecs)
    for (head, shared, qv, kv), (gh, gs, gq) in zip(arrays, term_grads):
        gk = None if kv is None else next(kvec_it).reshape(kv.shape)  # [B, H, Lk, 1] -> rows
        grads.append((gh, gs, gq, gk))
    return dq, dk, dv, None, None, None, tuple(grads)


_flash.defvjp(_flash_fwd, _flash_bwd)


# ---------------------------------------------------------------- pallas_call builders

def _params(cfg):
    if cfg.interpret or cfg.backend is None:
        return None
    if cfg.backend == "gpu":
        return plgpu.CompilerParams(num_warps=4, num_stages=2)
    return pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "parallel"))


def _scalar_spec(cfg):
    if cfg.backend == "tpu" and not cfg.interpret:
        return pl.BlockSpec(memory_space=pltpu.SMEM)  # scalars live in SMEM on TPU
    return pl.BlockSpec((2,), lambda *_: (0,))


def _call(cfg, kernel, name, grid, in_specs, out_specs, out_shape, *args):
    return pl.pallas_call(
        functools.partial(kernel, cfg=cfg), grid=grid, in_specs=in_specs, out_specs=out_specs,
        out_shape=out_shape, compiler_params=_params(cfg), interpret=cfg.interpret, name=name,
    )(*args)


def _flat(arrays):
    out = []
    for head, shared, qv, kv in arrays:
        out += list(head) + list(shared) + [x for x in (qv, kv) if x is not None]
    return out


def _query_specs(cfg, q, k, qpos, kpos, arrays):
    """In-specs of the per-query-block kernels (forward, dq): grid (B, H, nq)."""
    G, bq = cfg.groups, cfg.block_q
    pb = (lambda b: b) if cfg.batch_pos else (lambda b: 0)
    specs = [
        _scalar_spec(cfg),
        pl.BlockSpec((None, None, bq, q.shape[3]), lambda b, h, i: (b, h, i, 0)),
        pl.BlockSpec((None, None, k.shape[2], k.shape[3]), lambda b, h, i: (b, h // G, 0, 0)),
        pl.BlockSpec((None, None, k.shape[2], k.shape[3]), lambda b, h, i: (b, h // G, 0, 0)),
        pl.BlockSpec((None, bq, 1), lambda b, h, i: (pb(b), i, 0)),
        pl.BlockSpec((None,) + kpos.shape[1:], lambda b, h, i: (pb(b), 0, 0)),
    ]
    for head, shared, qv, kv in arrays:
        specs += [pl.BlockSpec((None,) + a.shape[1:], lambda b, h, i: (h, 0, 0)) for a in head]
        specs += [pl.BlockSpec(a.shape, lambda b, h, i: (0, 0)) for a in shared]
        if qv is not None:
            specs.append(pl.BlockSpec((None, None, bq, 1), lambda b, h, i: (b, h, i, 0)))
        if kv is not None:
            specs.append(pl.BlockSpec((None, None) + kv.shape[2:], lambda b, h, i: (b, h, 0, 0)))
    return specs


def _forward(cfg, q, k, v, qpos, kpos, scal, arrays):
    B, H, lqp, dh = q.shape
    grid = (B, H, lqp // cfg.block_q)
    row = pl.BlockSpec((None, None, cfg.block_q, 1), lambda b, h, i: (b, h, i, 0))
    out_specs = [pl.BlockSpec((None, None, cfg.block_q, dh), lambda b, h, i: (b, h, i, 0)), row]
    out_shape = [jax.ShapeDtypeStruct(q.shape, q.dtype),
                 jax.ShapeDtypeStruct((B, H, lqp, 1), jnp.float32)]
    return _call(cfg, fk._fwd_kernel, "posenc_flash_fwd", grid,
                 _query_specs(cfg, q, k, qpos, kpos, arrays), out_specs, out_shape,
                 scal, q, k, v, qpos, kpos, *_flat(arrays))


def _backward_dq(cfg, q, k, v, qpos, kpos, scal, arrays, do, lse, delta):
    B, H, lqp, dh = q.shape
    nq = lqp // cfg.block_q
    grid = (B, H, nq)
    qblock = pl.BlockSpec((None, None, cfg.block_q, dh), lambda b, h, i: (b, h, i, 0))
    row = pl.BlockSpec((None, None, cfg.block_q, 1), lambda b, h, i: (b, h, i, 0))
    in_specs = _query_specs(cfg, q, k, qpos, kpos, arrays) + [qblock, row, row]
    out_specs = [qblock]
    out_shape = [jax.ShapeDtypeStruct(q.shape, q.dtype)]
    for head, shared, qv, kv in arrays:
        for a in head:  # per-program partial sums, reduced below
            out_specs.append(pl.BlockSpec((None, None, None) + a.shape[1:],
                                          lambda b, h, i: (b, h, i, 0, 0)))
            out_shape.append(jax.ShapeDtypeStruct((B, H, nq) + a.shape[1:], jnp.float32))
        for a in shared:
            out_specs.append(pl.BlockSpec((None, None, None) + a.shape, lambda b, h, i: (b, h, i, 0, 0)))
            out_shape.append(jax.ShapeDtypeStruct((B, H, nq) + a.shape, jnp.float32))
        if qv is not None:
            out_specs.append(row)
            out_shape.append(jax.ShapeDtypeStruct(qv.shape, jnp.float32))
    outs = _call(cfg, fk._dq_kernel, "posenc_flash_dq", grid, in_specs, out_specs, out_shape,
                 scal, q, k, v, qpos, kpos, *_flat(arrays), do, lse, delta)
    dq, it = outs[0], iter(outs[1:])
    grads = []
    for head, shared, qv, kv in arrays:
        gh = tuple(next(it).sum((0, 2)) for _ in head)
        gs = tuple(next(it).sum((0, 1, 2)) for _ in shared)
        gq = None if qv is None else next(it)
        grads.append((gh, gs, gq))
    return dq, grads


def _backward_dkv(cfg, q, k, v, qpos, kpos, scal, arrays, do, lse, delta):
    """dk, dv and per-key vector gradients; grid (B, K, nk); transposed layouts (see kernels)."""
    B, H, lqp, dh = q.shape
    K, lkp = k.shape[1], k.shape[2]
    G, bq, bk = cfg.groups, cfg.block_q, cfg.block_k
    nq = lqp // bq
    grid = (B, K, lkp // bk)
    pb = (lambda b: b) if cfg.batch_pos else (lambda b: 0)
    rows = lambda x: x.reshape(x.shape[:-2] + (nq, bq))  # [.., Lq, 1] -> [.., nq, bq]
    cols = lambda x: x.reshape(x.shape[:-2] + (lkp, 1))  # [.., nk, bk] -> [.., Lk, 1]
    group = lambda x: pl.BlockSpec((None, G) + x.shape[2:], lambda b, g, j: (b, g, 0, 0))
    kcol = lambda: pl.BlockSpec((None, G, bk, 1), lambda b, g, j: (b, g, j, 0))
    kblock = pl.BlockSpec((None, None, bk, dh), lambda b, g, j: (b, g, j, 0))
    args = [scal, q, k, v, rows(qpos), cols(kpos)]
    in_specs = [
        _scalar_spec(cfg), group(q), kblock, kblock,
        pl.BlockSpec((None, nq, bq), lambda b, g, j: (pb(b), 0, 0)),
        pl.BlockSpec((None, bk, 1), lambda b, g, j: (pb(b), j, 0)),
    ]
    for head, shared, qv, kv in arrays:
        in_specs += [pl.BlockSpec((G,) + a.shape[1:], lambda b, g, j: (g, 0, 0)) for a in head]
        in_specs += [pl.BlockSpec(a.shape, lambda b, g, j: (0, 0)) for a in shared]
        args += list(head) + list(shared)
        if qv is not None:
            in_specs.append(group(rows(qv)))
            args.append(rows(qv))
        if kv is not None:
            in_specs.append(kcol())
            args.append(cols(kv))
    in_specs += [group(do), group(rows(lse)), group(rows(delta))]
    args += [do, rows(lse), rows(delta)]
    out_specs = [kblock, kblock]
    out_shape = [jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)]
    for head, shared, qv, kv in arrays:
        if kv is not None:
            out_specs.append(kcol())
            out_shape.append(jax.ShapeDtypeStruct((B, H, lkp, 1), jnp.float32))
    outs = _call(cfg, fk._dkv_kernel, "posenc_flash_dkv", grid, in_specs, out_specs, out_shape,
                 *args)
    return outs[0], outs[1], outs[2:]
