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

import jax
import jax.numpy as jnp

from posenc import checks
from posenc.kernels import flash_calls
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
        score_term.check_heads(score_term.as_terms(score_terms), h, b, lq, lk)
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
      interpret: None = the Pallas interpreter on CPU, compiled kernels elsewhere; True
        forces the interpreter; ``pltpu.InterpretParams()`` with ``backend="tpu"`` runs
        the TPU block specs in Pallas' TPU interpreter.
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
    out = flash_calls.flash(cfg, qt, kt, vt, qpos, kpos, scal, tuple(arrays))
    return jnp.swapaxes(out[:, :, :Lq, :Dh], 1, 2)
