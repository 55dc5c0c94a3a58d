"""The fused kernel compiled for TPU v5e and v6e by libtpu on this CPU host: supported()'s edge.

``posenc.kernels.supported`` refuses a TPU call whose forward, dq or dk/dv kernel
would not fit Mosaic's scoped VMEM (``posenc.kernels.flash.tpu_vmem``: the blocks
as Mosaic pads them, double-buffered, and its scratch; 16 MiB on v5e, 32 MiB on
v6e), so that ``attention_impl="auto"`` falls back to XLA instead of failing to
compile. Here XLA:TPU compiles (not only lowers) the kernels on both sides of
that edge, for a TPU topology that libtpu describes without a device: the
largest length supported() accepts compiles, and a length it refuses (one the
old estimate accepted) fails with Mosaic's scoped-VMEM error.

The accepted side is compiled in the worst case, with XLA's memory-space
assignment off, so every operand stays in HBM and goes through the kernel's
double buffers, as at a realistic batch; by default XLA may move small operands
into VMEM itself, which only lowers the need. Skipped without libtpu
(``pip install -e '.[crosscompile]'``).
"""

from __future__ import annotations

import functools
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("libtpu", reason="libtpu is not installed (pip install -e '.[crosscompile]')")

from posenc.kernels import flash as flash_lib  # noqa: E402
from posenc.kernels import flash_attention, supported, terms  # noqa: E402

D, DTYPE, BLOCK = 64, jnp.bfloat16, 128
BATCH = 4  # q, k, v too large for XLA to move into VMEM, so the refusals hold without NO_MSA too
# XLA:TPU's switch for memory-space assignment into VMEM, per generation (libtpu flags).
NO_MSA = {"v5e": "xla_vf_vmem_memory_space_assignment",
          "v6e": "xla_gf_vmem_memory_space_assignment"}


@pytest.fixture(autouse=True, scope="module")
def _no_persistent_cache():
    """Keeps these executables out of the persistent compilation cache (conftest turns it on):
    one compiled for a topology, without a device, cannot be read back."""
    before = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    yield
    jax.config.update("jax_enable_compilation_cache", before)


@functools.cache
def _topology_mesh(generation):
    from jax.experimental import topologies

    # libtpu's lockfile admits one process per host; test workers and compiles share it
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    topo = topologies.get_topology_desc(f"{generation}=1x1", platform="tpu")
    return jax.sharding.Mesh(np.array(topo.devices), ("x",))


def _mesh(generation):
    """A mesh of one TPU of ``generation`` ("v5e" | "v6e") from libtpu's topology, or skip."""
    try:
        return _topology_mesh(generation)
    except Exception as e:  # noqa: BLE001 (libtpu that cannot describe this TPU: nothing to test)
        pytest.skip(f"libtpu makes no TPU {generation} topology: {type(e).__name__}: {e}")


def _term(h):
    return terms.alibi(2.0 ** -jnp.arange(1, h + 1, dtype=jnp.float32))


def _supported(generation, length, heads, kv_heads):
    """supported() for an ALiBi call to ``generation`` (it reads the budget from the mesh)."""
    term = _term(heads)  # made outside the mesh: eager ops there would run on the (absent) TPU
    with jax.sharding.set_mesh(_mesh(generation)):
        return supported((1, length, heads, D), (1, length, kv_heads, D), dtype=DTYPE,
                         score_terms=term, backend="tpu", interpret=False)


def _edge(generation, heads, kv_heads):
    """The largest length (a multiple of the block) that supported() accepts."""
    lo, hi = 1, 1024  # in blocks; lo accepted, hi refused
    assert _supported(generation, lo * BLOCK, heads, kv_heads)[0]
    assert not _supported(generation, hi * BLOCK, heads, kv_heads)[0]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _supported(generation, mid * BLOCK, heads, kv_heads)[0] else (lo, mid)
    return lo * BLOCK


@functools.cache
def _compile(generation, length, heads, kv_heads, *, grad, batch=BATCH, worst_case=True):
    """XLA:TPU compiles ALiBi attention [batch, length, heads / kv_heads, 64] bf16 (its gradient
    with ``grad``) for ``generation``: "" when it compiles, else the platform and the reason.
    ``worst_case``: with XLA's memory-space assignment off (module doc)."""
    mesh = _mesh(generation)
    rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    pos = jnp.arange(length)[None]

    def attend(q, k, v):
        return flash_attention(q, k, v, q_positions=pos, k_positions=pos, score_terms=_term(heads),
                               scale=D ** -0.5, interpret=False, backend="tpu")

    loss = lambda *a: attend(*a).astype(jnp.float32).sum()  # noqa: E731
    fn = jax.grad(loss, argnums=(0, 1, 2)) if grad else attend
    args = [jax.ShapeDtypeStruct((batch, length, h, D), DTYPE, sharding=rep)
            for h in (heads, kv_heads, kv_heads)]
    options = {NO_MSA[generation]: False} if worst_case else {}
    with jax.sharding.set_mesh(mesh):
        lowered = jax.jit(fn).lower(*args)
        try:
            lowered.compile(compiler_options=options)
        except Exception as e:  # noqa: BLE001 (the reason is the result)
            reason = re.sub(r"\s+", " ", str(e))
            if "No such compile option" in reason and options:  # a libtpu without the flag
                return _compile(generation, length, heads, kv_heads, grad=grad, batch=batch,
                                worst_case=False)
            return (f"TPU {generation}, {'gradient' if grad else 'forward'} at batch {batch}, "
                    f"length {length}, heads {heads}/{kv_heads}: {type(e).__name__}: "
                    f"{reason[:1500]}")
    return ""


def _vmem_oom(reason, kernel):
    """Mosaic's scoped-VMEM error for ``kernel``, with the bytes it asked for."""
    m = re.search(r"(posenc_flash_[a-z]+)[\w.]* = .*Scoped allocation with size ([\d.]+\w) and "
                  r"limit ([\d.]+\w)", reason)
    assert m and m.group(1) == kernel and "vmem" in reason.lower(), reason
    return m.group(2), m.group(3)


def test_the_budget_follows_the_generation():
    with jax.sharding.set_mesh(_mesh("v5e")):
        assert flash_lib.tpu_vmem_budget() == (16 * 2 ** 20, "TPU v5 lite")
    with jax.sharding.set_mesh(_mesh("v6e")):
        assert flash_lib.tpu_vmem_budget() == (32 * 2 ** 20, "TPU v6 lite")
    if jax.default_backend() != "tpu":  # no target named: v5e's, the smallest
        assert flash_lib.tpu_vmem_budget()[0] == 16 * 2 ** 20


def test_v5e_forward_at_the_edge_compiles_and_16k_does_not():
    """16 kv heads: every length from 12,288 to 24,576 passed the old estimate (2 x 2 x Lk x Dh x
    itemsize <= 12 MiB) and the forward failed to compile at 16,384; now the largest length
    supported() accepts compiles and 16,384 is refused."""
    edge = _edge("v5e", 16, 16)
    assert 12_288 <= edge < 16_384, edge
    failed = _compile("v5e", edge, 16, 16, grad=False)
    assert not failed, failed
    ok, why = _supported("v5e", 16_384, 16, 16)
    assert not ok and "VMEM" in why and str(16 * 2 ** 20) in why, why
    size, limit = _vmem_oom(_compile("v5e", 16_384, 16, 16, grad=False), "posenc_flash_fwd")
    assert limit == "16.00M", (size, limit)


def test_v5e_gqa_training_at_the_edge_compiles_and_6k_does_not():
    """GQA 16/4 (the dk/dv kernel holds q and do of 4 query heads whole): 6,144 passed the old
    estimate and its dk/dv kernel failed to compile; now the edge compiles and 6,144 is refused."""
    edge = _edge("v5e", 16, 4)
    assert 2_048 <= edge < 6_144, edge
    failed = _compile("v5e", edge, 16, 4, grad=True)
    assert not failed, failed
    ok, why = _supported("v5e", 6_144, 16, 4)
    assert not ok and "dk/dv kernel" in why, why
    _vmem_oom(_compile("v5e", 6_144, 16, 4, grad=True), "posenc_flash_dkv")


def test_v6e_compiles_what_v5e_refuses():
    """v6e's 32 MiB of scoped VMEM: a length refused for v5e is accepted for v6e and compiles."""
    assert not _supported("v5e", 16_384, 16, 16)[0]
    assert _supported("v6e", 16_384, 16, 16) == (True, "")
    assert supported((1, 16_384, 16, D), (1, 16_384, 16, D), dtype=DTYPE, score_terms=_term(16),
                     backend="tpu", interpret=False, tpu_vmem_bytes=32 * 2 ** 20) == (True, "")
    failed = _compile("v6e", 16_384, 16, 16, grad=False)
    assert not failed, failed
