"""The fused kernel's Triton IR compiles to CUDA cubins for sm_90 (H100/H200) and sm_80 (A100)
on any host, without a GPU or driver, within each arch's per-block shared-memory limit.

The module is the one of test_flash_kernel.py's lowering check (``_export("cuda")``: forward,
dq and dk/dv kernels with ALiBi + T5 + KERPLE + FIRE + FoX, GQA, softcap, window, chunk, at
the default GPU blocks 64 x 64, bfloat16), lowered once for an abstract H100; the same IR
serves sm_80 (Pallas' Triton lowering reads the compute capability only for float8 casts).
Each kernel x arch is compiled once (tests/cross_compile.py has the recipe). float32 has the
same default blocks and twice the bytes per tile, the most shared memory of the defaults; its
six compiles take as long again, so POSENC_SLOW=1 adds them. The measured bytes are in each assert message, and printed:
``pytest -rP`` shows them for passing tests too.
"""

from __future__ import annotations

import os

import jax.numpy as jnp
import pytest

pytest.importorskip("triton", reason="needs the triton package (pip install -e '.[crosscompile]')",
                    exc_type=ImportError)
pytest.importorskip("triton.backends.nvidia.compiler", reason="this triton has no CUDA backend",
                    exc_type=ImportError)

import cross_compile  # noqa: E402
from test_flash_kernel import _export  # noqa: E402

SLOW = os.environ.get("POSENC_SLOW") == "1"
ARCHS = (90, 80)
KERNELS = ("posenc_flash_fwd", "posenc_flash_dq", "posenc_flash_dkv")
DTYPES = {"bfloat16": jnp.bfloat16, "float32": jnp.float32}
DTYPE_PARAMS = ["bfloat16", pytest.param("float32", marks=pytest.mark.skipif(
    not SLOW, reason="float32 doubles the compile time; set POSENC_SLOW=1"))]


class _Compiled:
    """Lowers each dtype once and compiles each (dtype, kernel, arch) once, on first use."""

    def __init__(self):
        self.kernels, self.cubins = {}, {}

    def lowered(self, dtype):
        if dtype not in self.kernels:
            self.kernels[dtype] = cross_compile.triton_kernels(_export("cuda", DTYPES[dtype]))
        return self.kernels[dtype]

    def cubin(self, dtype, name, arch):
        key = (dtype, name, arch)
        if key not in self.cubins:
            [kernel] = [k for k in self.lowered(dtype) if k.name == name]
            try:
                self.cubins[key] = cross_compile.cubin(kernel, arch)
            except cross_compile.CrossCompileError as e:
                self.cubins[key] = e  # fail once, not a recompile per request
        if isinstance(self.cubins[key], Exception):
            raise self.cubins[key]
        return self.cubins[key]


@pytest.fixture(scope="module")
def compiled():
    return _Compiled()


@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
def test_every_triton_kernel_is_extracted(compiled, dtype):
    kernels = compiled.lowered(dtype)
    assert [k.name for k in kernels] == list(KERNELS)
    for k in kernels:
        assert (k.num_warps, k.num_stages) == (4, 2), k.name  # flash_calls._params
        assert "tt.func" in k.ttir and "tt.dot" in k.ttir, k.name


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
def test_cubin_fits_shared_memory(compiled, dtype, kernel, arch):
    result = compiled.cubin(dtype, kernel, arch)
    limit = cross_compile.SHARED_OPTIN[arch]
    what = f"{kernel} {dtype} sm_{arch}: {result.summary()}; limit {limit} B"
    print(what)
    assert result.cubin[:4] == b"\x7fELF" and len(result.cubin) > 1024, what
    assert 0 < result.shared and result.total_shared <= limit, what


def test_a_failed_compile_names_kernel_arch_and_reason(compiled):
    kernel = compiled.lowered("bfloat16")[0]
    broken = kernel._replace(ttir=kernel.ttir.replace("tt.dot", "tt.not_an_op", 1))
    with pytest.raises(cross_compile.CrossCompileError,
                       match=r"(?s)posenc_flash_fwd for sm_80 .*tt\.not_an_op"):
        cross_compile.cubin(broken, 80)
