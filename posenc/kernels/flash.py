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
output 0 and zero gradients. Learned sinks (gpt-oss; ``sinks`` [H], as
``posenc.learned_sinks``) join each row's denominator after the key loop; the
saved log-sum-exp includes them, so the backward kernels are unchanged and the
sinks' gradient is one reduction outside them.

Backends: Triton on GPU, Mosaic on TPU, the Pallas interpreter elsewhere
(``interpret=None`` picks it on CPU; ``interpret=True`` forces it).
:func:`supported` says whether a call can run, so callers can fall back to
``posenc.model.attention`` (XLA blocked) otherwise; on TPU it counts each
kernel's scoped VMEM (:func:`tpu_vmem`: the blocks as Mosaic pads them,
double-buffered, and its scratch) against Mosaic's limit for the TPU generation
(:func:`tpu_vmem_budget`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from posenc import checks
from posenc.kernels import flash_calls, score_term
from posenc.kernels import flash_kernels as fk

BACKENDS = ("gpu", "tpu")
DEFAULT_BLOCKS = {"gpu": (64, 64), "tpu": (128, 128), None: (64, 64)}
MIN_BLOCK = {"gpu": 16, "tpu": 8, None: 8}  # Triton's dot needs tiles of >= 16
KIB, MIB = 2 ** 10, 2 ** 20
# Mosaic's default scoped-VMEM limit per TensorCore (all that one kernel's blocks and
# scratch may use), by device kind; any other TPU, or one of unknown generation
# (compiling from a CPU host), gets TPU_VMEM_DEFAULT, the smallest known (v5e's).
TPU_SCOPED_VMEM = {"TPU v5 lite": 16 * MIB, "TPU v5e": 16 * MIB,
                   "TPU v6 lite": 32 * MIB, "TPU v6e": 32 * MIB}
TPU_VMEM_DEFAULT = 16 * MIB
# Mosaic's scratch beyond the blocks (the tile values it keeps in VMEM), per program at
# 128 x 128 tiles, scaled by the tile area for larger ones: a base for every kernel (per
# 128 lanes of the head dim), plus per term (by Term.name) the (forward, dq, dk/dv) bytes at
# the width it was measured at (T5's 32 buckets, FIRE's 32 hidden units), scaled up linearly for wider terms (widest
# head or shared array). Upper bounds, rounded up to 64 KiB, of what libtpu 0.0.50.1
# needed on v5e and v6e (FIRE's dq: 3.8 MiB on v5e, 4.9 MiB on v6e); a term not listed
# is costed as FIRE, the largest.
TPU_SCRATCH_BASE = 384 * KIB
TPU_TERM_SCRATCH = {
    "alibi": (1, 64 * KIB, 128 * KIB, 64 * KIB),
    "kerple_log": (1, 64 * KIB, 320 * KIB, 64 * KIB),
    "kerple_power": (1, 64 * KIB, 320 * KIB, 64 * KIB),
    "fox": (1, 64 * KIB, 192 * KIB, 320 * KIB),
    "t5": (32, 256 * KIB, 448 * KIB, 320 * KIB),
    "fire": (32, 704 * KIB, 4672 * KIB, 768 * KIB),
}
# Safety margin kept free below the limit: with it, the estimate exceeded each need measured
# (v5e and v6e, worst case of every operand in HBM; each term alone and all five summed;
# bf16 and f32; 1 and 4 query heads per kv head; head dims 64 to 256) by 240 KiB or more
# (without it, the five terms summed came 16 KiB short in the forward kernel).
TPU_VMEM_MARGIN = 256 * KIB


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


def _vmem_block(shape, itemsize):
    """Bytes of one VMEM block as Mosaic lays it out: the last dim padded to 128 lanes, the
    second-to-last to the sublane tile (8 rows of 32-bit values, 16 of 16-bit), so a
    [n, 1] column takes n x 128 and an [1, n] row 8 (16) x n."""
    *lead, rows, lanes = (1,) * max(0, 2 - len(shape)) + tuple(shape)
    sub = 8 * 4 // itemsize
    n = itemsize * (-(-rows // sub) * sub) * (-(-lanes // 128) * 128)
    for x in lead:
        n *= x
    return n


def _term_scratch(t, kernel):
    """Mosaic's scratch for term ``t`` in kernel 0 (forward), 1 (dq) or 2 (dk/dv), 128² tiles."""
    at, *sizes = TPU_TERM_SCRATCH.get(t.name, TPU_TERM_SCRATCH["fire"])
    width = max([a.shape[1] for a in t.head + t.shared] + [1])
    return sizes[kernel] * width // at if width > at else sizes[kernel]


def tpu_vmem(q_shape, k_shape, *, dtype=jnp.float32, score_terms=(), block_q=None, block_k=None):
    """Bytes of scoped VMEM each TPU kernel needs per program: {"forward", "dq", "dk/dv"}.

    Its blocks as Mosaic lays them out (:func:`_vmem_block`), each twice: every operand
    that XLA leaves in HBM is pipelined through two buffers (the scalars live in SMEM).
    Block shapes, from ``flash_calls`` (G = H / K query heads per kv head):

    forward  q [bq, Dh]; k, v [Lk, Dh] (the whole sequence of one kv head); q_pos [bq, 1];
             k_pos [nk, bk]; per term: head rows [1, n], shared [m, n], q_vec [bq, 1],
             k_vec [nk, bk]; out o [bq, Dh] f32, lse [bq, 1] f32
    dq       the forward's inputs and do [bq, Dh], lse, delta [bq, 1] f32; out dq [bq, Dh],
             per term the gradients of head [1, n], shared [m, n], q_vec [bq, 1]
    dk/dv    q, do [G, Lq, Dh] (the whole sequence of a kv head's query heads); k, v [bk, Dh];
             q_pos [nq, bq]; k_pos [bk, 1]; lse, delta [G, nq, bq] f32; per term: head
             [G, 1, n], shared [m, n], q_vec [G, nq, bq], k_vec [G, bk, 1]; out dk, dv
             [bk, Dh], k_vec gradients [G, bk, 1]

    (Lq, Lk padded to the blocks, term arrays to powers of two, as in
    :func:`flash_attention`); plus Mosaic's scratch for the tile's values
    (``TPU_SCRATCH_BASE``, ``TPU_TERM_SCRATCH``). XLA may place small operands in VMEM
    itself, which only lowers the need.
    """
    _, lq, h, d = q_shape
    lk, kh = k_shape[1], k_shape[2]
    terms = score_term.as_terms(score_terms)
    bq, bk = _blocks(block_q, block_k, lq, lk, "tpu")
    g = h // kh
    nq, nk = -(-lq // bq), -(-lk // bk)
    lqp, lkp = nq * bq, nk * bk
    item = jnp.dtype(dtype).itemsize
    blk, f32, i32 = _vmem_block, 4, 4
    fwd_in = (blk((bq, d), item) + 2 * blk((lkp, d), item) + blk((bq, 1), i32)
              + blk((nk, bk), i32))
    fwd_out = blk((bq, d), f32) + blk((bq, 1), f32)
    dq_out = blk((bq, d), item)
    dkv_in = (2 * blk((g, lqp, d), item) + 2 * blk((bk, d), item) + blk((nq, bq), i32)
              + blk((bk, 1), i32) + 2 * blk((g, nq, bq), f32))
    dkv_out = 2 * blk((bk, d), item)
    for t in terms:
        widths = [_pow2(a.shape[1]) for a in t.head]
        shared = sum(blk((_pow2(a.shape[0]), _pow2(a.shape[1])), f32) for a in t.shared)
        rows = sum(blk((1, n), f32) for n in widths)
        fwd_in += rows + shared
        dq_out += rows + shared
        dkv_in += sum(blk((g, 1, n), f32) for n in widths) + shared
        if t.q_vec is not None:
            fwd_in += blk((bq, 1), f32)
            dq_out += blk((bq, 1), f32)
            dkv_in += blk((g, nq, bq), f32)
        if t.k_vec is not None:
            fwd_in += blk((nk, bk), f32)
            dkv_in += blk((g, bk, 1), f32)
            dkv_out += blk((g, bk, 1), f32)
    dq_in = fwd_in + blk((bq, d), item) + 2 * blk((bq, 1), f32)  # and do, lse, delta
    area = max(1, bq * bk // (128 * 128))
    base = TPU_SCRATCH_BASE * -(-d // 128)  # grows with the [b, Dh] float32 accumulators
    scratch = [area * (base + sum(_term_scratch(t, i) for t in terms)) for i in range(3)]
    return {"forward": 2 * (fwd_in + fwd_out) + scratch[0],
            "dq": 2 * (dq_in + dq_out) + scratch[1],
            "dk/dv": 2 * (dkv_in + dkv_out) + scratch[2]}


def _tpu_device_kind():
    """Device kind of the TPU targeted: an abstract mesh's, else the default device's, else None."""
    device = getattr(jax.sharding.get_abstract_mesh(), "abstract_device", None)
    if device is not None:
        return device.device_kind
    if jax.default_backend() == "tpu":
        return jax.devices()[0].device_kind
    return None


def tpu_vmem_budget() -> tuple[int, str]:
    """``(bytes, what)``: Mosaic's scoped-VMEM limit on the targeted TPU (``TPU_SCOPED_VMEM``)."""
    kind = _tpu_device_kind()
    if kind in TPU_SCOPED_VMEM:
        return TPU_SCOPED_VMEM[kind], kind
    return TPU_VMEM_DEFAULT, f"{kind or 'TPU of unknown generation'}: v5e's"


def supported(q_shape, k_shape, *, dtype=jnp.float32, score_terms=(), block_q=None, block_k=None,
              backend=None, interpret=None, tpu_vmem_bytes=None) -> tuple[bool, str]:
    """Whether :func:`flash_attention` can run this call; ``(ok, reason)`` (reason "" when ok).

    Checks what the kernel needs, per backend: dtype float32 / bfloat16, GQA
    (H % K == 0), equal head dims, and on TPU that each of the forward, dq and dk/dv
    kernels fits the scoped VMEM: its need (:func:`tpu_vmem`: blocks as Mosaic pads
    them, double-buffered, plus scratch) and ``TPU_VMEM_MARGIN`` within
    ``tpu_vmem_bytes``, by default Mosaic's limit on the targeted TPU (16 MiB on v5e,
    32 MiB on v6e; v5e's when the generation is unknown, as when compiling from a CPU
    host). All three kernels are checked, since the caller may differentiate. CoPE
    and Shaw (content-dependent terms) have no kernel term; callers keep the XLA path
    for them.
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
        score_term.check_heads(terms, h, b, lq, lk)
        _blocks(block_q, block_k, lq, lk, backend)
        if tpu_vmem_bytes is not None:
            tpu_vmem_bytes = checks.integer("tpu_vmem_bytes", tpu_vmem_bytes, minimum=1)
    except ValueError as e:
        return False, str(e)
    if backend == "tpu" and not interpret:
        budget, what = (tpu_vmem_bytes, "given") if tpu_vmem_bytes else tpu_vmem_budget()
        need = tpu_vmem(q_shape, k_shape, dtype=dtype, score_terms=terms, block_q=block_q,
                        block_k=block_k)
        kernel = max(need, key=need.get)
        if need[kernel] + TPU_VMEM_MARGIN > budget:
            return False, (f"sequence too long for the TPU kernels' VMEM: the {kernel} kernel "
                           f"needs {need[kernel]} bytes + {TPU_VMEM_MARGIN} margin > {budget} "
                           f"bytes of scoped VMEM ({what})")
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
                    q_offset=0, kv_length=None, window=None, chunk=None, softcap=0.0, sinks=None,
                    block_q=None, block_k=None, interpret=None, backend=None):
    """Fused attention with in-kernel position terms (see module doc).

    Args:
      q: [B, Lq, H, Dh]; k, v: [B, Lk, K, Dh] with H % K == 0 (GQA, k/v never repeated);
        v may be narrower (Dv <= Dh: PoPE's wider q and k), the output then [B, Lq, H, Dv].
      q_positions, k_positions: int [B or 1, Lq], [B or 1, Lk] (read by the terms only).
      score_terms: a Term or a sequence of Terms from ``posenc.kernels.terms`` (summed).
      scale: static float multiplying q.k (fold a learned temperature into q).
      causal, window, chunk, kv_length, q_offset: masks by index (module doc); q_offset
        and kv_length may be traced scalars.
      softcap: 0 = off, else ``cap * tanh(s / cap)`` on the pre-mask logit.
      sinks: None, or a float [H] of learned sink logits (gpt-oss, ``posenc.learned_sinks``): each
        joins its head's softmax denominator, ``exp(s_h - m)`` after the key loop; differentiable.
      block_q, block_k: powers of two (default 64 on GPU, 128 on TPU), clipped to the lengths.
      interpret: None = the Pallas interpreter on CPU, compiled kernels elsewhere; True
        forces the interpreter; ``pltpu.InterpretParams()`` with ``backend="tpu"`` runs
        the TPU block specs in Pallas' TPU interpreter.
      backend: "gpu" (Triton) | "tpu" (Mosaic) | None = from the default device.
    Returns:
      [B, Lq, H, Dv] in q.dtype (Dv = Dh unless v is narrower).
    """
    q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4 or v.shape[:3] != k.shape[:3] or v.shape[3] > k.shape[3]:
        raise ValueError(f"q must be [B, Lq, H, Dh] and k, v [B, Lk, K, Dh] (v may be narrower: "
                         f"Dv <= Dh); got {q.shape}, {k.shape}, {v.shape}")
    B, Lq, H, Dh = q.shape
    Dv = v.shape[3]  # v is zero-padded to the q / k width below; the padding's output is dropped
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
    if sinks is not None:
        sinks = jnp.asarray(sinks)
        if sinks.shape != (H,):
            raise ValueError(f"sinks must have shape [H] = ({H},); got {sinks.shape}")
        sinks = sinks.astype(jnp.float32).reshape(H, 1, 1)
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
                    backend=backend, sinks=sinks is not None)
    if cfg.batch_pos:
        qpos = jnp.broadcast_to(qpos, (B,) + qpos.shape[1:])
        kpos = jnp.broadcast_to(kpos, (B,) + kpos.shape[1:])
    out = flash_calls.flash(cfg, qt, kt, vt, qpos, kpos, scal, tuple(arrays), sinks)
    return jnp.swapaxes(out[:, :, :Lq, :Dv], 1, 2)
