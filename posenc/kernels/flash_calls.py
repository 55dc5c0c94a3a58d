"""The Pallas calls of the fused attention: block specs, grids, and the custom VJP.

``flash(cfg, q, k, v, q_pos, k_pos, scalars, arrays)`` takes the kernel
layouts prepared by ``posenc.kernels.flash.flash_attention`` and returns the
padded output; its VJP runs the dq and dk/dv kernels of
``posenc.kernels.flash_kernels``. The forward kernel writes the output in
float32, kept as the residual: the backward's row term
``delta_i = do_i . o_i`` must match ``sum_j p_ij dp_ij`` closely, since the
gradient of a term array sums ``ds = p (dp - delta)`` over every visible
(query, key) pair; from a bf16-rounded ``o`` those row errors add up (FIRE's
output-bias gradient at [2, 384, 8, 64]: 20% of its scale, 6% from float32).
The gradients of the term arrays come out of the dq kernel as one partial
sum per (batch, head, query block) and are summed here.
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

from posenc.kernels import flash_kernels as fk

# ---------------------------------------------------------------- custom VJP

@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def flash(cfg, q, k, v, qpos, kpos, scal, arrays, sinks):
    return _forward(cfg, q, k, v, qpos, kpos, scal, arrays, sinks)[0].astype(q.dtype)


def _flash_fwd(cfg, q, k, v, qpos, kpos, scal, arrays, sinks):
    o, lse = _forward(cfg, q, k, v, qpos, kpos, scal, arrays, sinks)
    return o.astype(q.dtype), (q, k, v, qpos, kpos, scal, arrays, sinks, o, lse)


def _sink_grad(sinks, lse, delta):
    """d loss / d s_h = -sum_i w_sink,i delta_i: the sink's value is zero, so its dp is 0 and
    ds = w_sink (0 - delta), with w_sink = exp(s_h - lse_i) (padded rows have delta 0)."""
    w_sink = jnp.exp(sinks.reshape(1, -1, 1, 1) - lse)
    return -jnp.sum(w_sink * delta, axis=(0, 2, 3)).reshape(sinks.shape)


def _flash_bwd(cfg, res, do):
    q, k, v, qpos, kpos, scal, arrays, sinks, o, lse = res
    do = do.astype(q.dtype)
    delta = jnp.sum(o.astype(jnp.float32) * do.astype(jnp.float32), axis=-1, keepdims=True)
    dq, term_grads = _backward_dq(cfg, q, k, v, qpos, kpos, scal, arrays, do, lse, delta)
    dk, dv, dkvecs = _backward_dkv(cfg, q, k, v, qpos, kpos, scal, arrays, do, lse, delta)
    grads = []
    kvec_it = iter(dkvecs)
    for (_head, _shared, _qv, kv), (gh, gs, gq) in zip(arrays, term_grads):
        gk = None if kv is None else next(kvec_it).reshape(kv.shape)  # [B, H, Lk, 1] -> rows
        grads.append((gh, gs, gq, gk))
    dsinks = None if sinks is None else _sink_grad(sinks, lse, delta)
    return dq, dk, dv, None, None, None, tuple(grads), dsinks


flash.defvjp(_flash_fwd, _flash_bwd)


# ---------------------------------------------------------------- pallas_call builders

def _tpu_interpreter(cfg):
    return isinstance(cfg.interpret, pltpu.InterpretParams)


def _params(cfg):
    if cfg.backend is None or (cfg.interpret and not _tpu_interpreter(cfg)):
        return None
    if cfg.backend == "gpu":
        return plgpu.CompilerParams(num_warps=4, num_stages=2)
    return pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "parallel"))


def _scalar_spec(cfg):
    if cfg.backend == "tpu" and (not cfg.interpret or _tpu_interpreter(cfg)):
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


def _forward(cfg, q, k, v, qpos, kpos, scal, arrays, sinks):
    B, H, lqp, dh = q.shape
    grid = (B, H, lqp // cfg.block_q)
    row = pl.BlockSpec((None, None, cfg.block_q, 1), lambda b, h, i: (b, h, i, 0))
    out_specs = [pl.BlockSpec((None, None, cfg.block_q, dh), lambda b, h, i: (b, h, i, 0)), row]
    out_shape = [jax.ShapeDtypeStruct(q.shape, jnp.float32),
                 jax.ShapeDtypeStruct((B, H, lqp, 1), jnp.float32)]
    in_specs, extra = _query_specs(cfg, q, k, qpos, kpos, arrays), []
    if cfg.sinks:  # [H, 1, 1]: the head's sink logit
        in_specs.append(pl.BlockSpec((None, 1, 1), lambda b, h, i: (h, 0, 0)))
        extra.append(sinks)
    return _call(cfg, fk._fwd_kernel, "posenc_flash_fwd", grid, in_specs, out_specs, out_shape,
                 scal, q, k, v, qpos, kpos, *_flat(arrays), *extra)


def _backward_dq(cfg, q, k, v, qpos, kpos, scal, arrays, do, lse, delta):
    B, H, lqp, dh = q.shape
    nq = lqp // cfg.block_q
    grid = (B, H, nq)
    qblock = pl.BlockSpec((None, None, cfg.block_q, dh), lambda b, h, i: (b, h, i, 0))
    row = pl.BlockSpec((None, None, cfg.block_q, 1), lambda b, h, i: (b, h, i, 0))
    in_specs = _query_specs(cfg, q, k, qpos, kpos, arrays) + [qblock, row, row]
    out_specs = [qblock]
    out_shape = [jax.ShapeDtypeStruct(q.shape, q.dtype)]
    for head, shared, qv, _kv in arrays:
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
    for head, shared, qv, _kv in arrays:
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
    for _head, _shared, _qv, kv in arrays:
        if kv is not None:
            out_specs.append(kcol())
            out_shape.append(jax.ShapeDtypeStruct((B, H, lkp, 1), jnp.float32))
    outs = _call(cfg, fk._dkv_kernel, "posenc_flash_dkv", grid, in_specs, out_specs, out_shape,
                 *args)
    return outs[0], outs[1], outs[2:]
