"""Compile the Triton kernels of a lowered JAX module to CUDA cubins, without a GPU.

A Pallas Triton call lowers to a ``stablehlo.custom_call @__gpu$xla.gpu.triton``
whose ``mhlo.backend_config`` dictionary holds ``name``, ``num_warps``,
``num_stages``, ``grid_x/y/z`` and ``ir``: the kernel's Triton IR as MLIR
*bytecode* (uncompressed; jax/_src/pallas/triton/pallas_call_registration.py).
Recipe, with the ``triton`` PyPI package (it ships ptxas; no driver needed):

1. parse the lowered module's text with JAX's MLIR context and read each
   custom call's backend_config (:func:`triton_kernels`);
2. read the bytecode with Triton's own MLIR context
   (``triton._C.libtriton.ir.parse_mlir_module(path, context)``) and print it
   as text: ``triton.compile`` takes a ``.ttir`` file, read as text;
3. ``triton.compile(path, target=GPUTarget("cuda", arch, 32),
   options={"num_warps", "num_stages", "enable_fp_fusion"})`` in a throwaway
   cache directory; ``kernel.asm["cubin"]`` is the ELF, ``kernel.metadata.shared``
   the dynamic shared memory in bytes (:func:`cubin`; sm_90 compiles for
   sm_90a). Registers, stack and spill bytes come from the ptxas -v log that
   Triton prints with ``knobs.nvidia.dump_ptxas_log``; the cubin's static shared
   memory (1 KiB reserved on sm_90) from the cuobjdump that Triton ships.

The numbers are those of Triton's own pipeline; XLA compiles the same IR with
its bundled Triton, which may allocate a little differently. Test helper
module, not collected (no ``test_`` prefix).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import NamedTuple

TRITON_TARGET = "__gpu$xla.gpu.triton"
# Shared memory per block with the opt-in attribute (cudaDevAttrMaxSharedMemoryPerBlockOptin):
# what Triton checks a kernel's shared memory against before launching it.
SHARED_OPTIN = {90: 227 * 1024, 80: 163 * 1024}  # sm_90 H100/H200, sm_80 A100


class CrossCompileError(RuntimeError):
    """A kernel that could not be extracted or compiled; the message names kernel, arch and reason."""


class TritonKernel(NamedTuple):
    name: str
    ttir: str  # Triton IR, MLIR text
    num_warps: int
    num_stages: int
    grid: tuple[int, int, int]


class Cubin(NamedTuple):
    cubin: bytes
    shared: int  # dynamic shared memory, bytes (kernel.metadata.shared)
    static_shared: int | None  # the cubin's static shared memory, bytes (None: no cuobjdump)
    registers: int | None  # per thread, from ptxas -v (None: no log)
    stack: int | None  # stack frame per thread, bytes
    spill_stores: int | None  # bytes
    spill_loads: int | None
    seconds: float  # compile wall time

    @property
    def total_shared(self) -> int:
        """Dynamic + static: what must fit the per-block opt-in limit (Triton's launcher lets
        the dynamic part use the opt-in limit less the static part)."""
        return self.shared + (self.static_shared or 0)

    def summary(self) -> str:
        return (f"shared {self.shared} B dynamic + {self.static_shared} B static, "
                f"{self.registers} registers, {self.stack} B stack, {self.spill_stores} B spill "
                f"stores, {self.seconds:.1f} s")


@contextlib.contextmanager
def _stderr_captured():
    """Collects what is written to file descriptor 2 (MLIR's and LLVM's diagnostics) in the
    yielded list, to put the reason into an error."""
    sys.stderr.flush()
    saved = os.dup(2)
    out = []
    with tempfile.TemporaryFile() as f:
        os.dup2(f.fileno(), 2)
        try:
            yield out
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            f.seek(0)
            out.append(f.read().decode(errors="replace"))


def _reason(e: Exception, stderr: list) -> str:
    said = "".join(stderr).strip()
    return f"{type(e).__name__}: {e}" + (f"\n{said[-3000:]}" if said else "")


def _triton_text(name: str, bytecode: bytes) -> str:
    """Triton IR bytecode -> MLIR text, read by Triton's own MLIR context."""
    from triton._C.libtriton import ir as tir

    context = tir.context()
    tir.load_dialects(context)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, f"{name}.mlirbc")
        with open(path, "wb") as f:
            f.write(bytecode)
        try:
            with _stderr_captured() as said:
                return str(tir.parse_mlir_module(path, context))
        except Exception as e:  # noqa: BLE001 (any parser failure, reported with the kernel)
            raise CrossCompileError(f"kernel {name}: triton cannot read its IR bytecode "
                                    f"({len(bytecode)} bytes): {_reason(e, said)}") from e


def triton_kernels(mlir_text: str) -> list[TritonKernel]:
    """Every ``__gpu$xla.gpu.triton`` custom call of a lowered (StableHLO) module, in order."""
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir import ir

    calls = []
    with mlir.make_ir_context():
        module = ir.Module.parse(mlir_text)

        def visit(op):
            if (op.name == "stablehlo.custom_call"
                    and ir.StringAttr(op.attributes["call_target_name"]).value == TRITON_TARGET):
                calls.append(op)
            return ir.WalkResult.ADVANCE

        module.operation.walk(visit)
        out = []
        for op in calls:
            cfg = ir.DictAttr(op.attributes["mhlo.backend_config"])
            name = ir.StringAttr(cfg["name"]).value
            ints = {k: ir.IntegerAttr(cfg[k]).value
                    for k in ("num_warps", "num_stages", "grid_x", "grid_y", "grid_z")}
            out.append((name, ir.StringAttr(cfg["ir"]).value_bytes, ints))
    return [TritonKernel(name, _triton_text(name, bc), ints["num_warps"], ints["num_stages"],
                         (ints["grid_x"], ints["grid_y"], ints["grid_z"]))
            for name, bc, ints in out]


def _static_shared(cubin: bytes, name: str) -> int | None:
    """The cubin's static shared memory (sm_90 cubins reserve 1 KiB), by Triton's cuobjdump."""
    from triton import knobs

    try:
        tool = knobs.nvidia.cuobjdump.path
    except RuntimeError:  # a triton without its bundled cuobjdump
        return None
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, f"{name}.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        run = subprocess.run([tool, "--dump-resource-usage", path], capture_output=True,
                             text=True, timeout=60)
    m = re.search(r"\bSHARED:(\d+)", run.stdout)
    return int(m[1]) if run.returncode == 0 and m else None


def _ptxas_numbers(log: str):
    """(registers, stack, spill stores, spill loads) from ptxas -v; Nones where absent."""
    frame = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log)
    regs = re.search(r"Used (\d+) registers", log)
    return ((int(regs[1]) if regs else None),) + (tuple(map(int, frame.groups())) if frame else (None,) * 3)


def cubin(kernel: TritonKernel, arch: int) -> Cubin:
    """Compile one kernel for ``sm_<arch>`` (90: H100/H200, 80: A100) with Triton, no device."""
    try:
        import triton
        from triton import knobs
        from triton.backends.compiler import GPUTarget
    except ImportError as e:
        raise CrossCompileError(f"kernel {kernel.name} for sm_{arch}: triton is not importable: {e}") from e
    options = {"num_warps": kernel.num_warps, "num_stages": kernel.num_stages,
               "enable_fp_fusion": True}  # Triton's default, stated (it warns when unset)
    log = io.StringIO()
    with (tempfile.TemporaryDirectory() as d, knobs.cache.scope(), knobs.compilation.scope(),
          knobs.nvidia.scope()):
        knobs.cache.dir = os.path.join(d, "cache")  # nothing read from or left in ~/.triton
        knobs.compilation.always_compile = True
        knobs.nvidia.dump_ptxas_log = True  # triton prints ptxas -v to stdout: captured below
        path = os.path.join(d, f"{kernel.name}.ttir")  # the suffix tells triton the IR's stage
        with open(path, "w") as f:
            f.write(kernel.ttir)
        start = time.perf_counter()
        try:
            with contextlib.redirect_stdout(log), _stderr_captured() as said:
                compiled = triton.compile(path, target=GPUTarget("cuda", arch, 32), options=options)
            binary = compiled.asm["cubin"]  # read eagerly, before the cache directory goes
            shared = int(compiled.metadata.shared)
        except Exception as e:  # noqa: BLE001 (MLIR pass failures, ptxas errors, out of resources)
            raise CrossCompileError(f"kernel {kernel.name} for sm_{arch} (num_warps="
                                    f"{kernel.num_warps}, num_stages={kernel.num_stages}): "
                                    f"{_reason(e, said)}") from e
        seconds = time.perf_counter() - start
    if not binary.startswith(b"\x7fELF"):
        raise CrossCompileError(f"kernel {kernel.name} for sm_{arch}: the cubin is not an ELF "
                                f"({len(binary)} bytes)")
    return Cubin(binary, shared, _static_shared(binary, kernel.name), *_ptxas_numbers(log.getvalue()),
                 seconds)
