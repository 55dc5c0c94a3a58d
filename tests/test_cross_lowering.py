"""The decoder on the fused kernel, lowered for TPU (Mosaic) and CUDA (Triton) on this CPU host.

``posenc.model.fused.force_backend`` makes the model trace what it would trace on
a GPU or TPU (``attention_impl="pallas"`` with the compiled kernel, ``dtype="auto"``
as bfloat16); ``jax.export`` lowers the program for that platform under an
abstract mesh of one such device. No device is needed and nothing runs. One model
holds a layer of each encoding with in-kernel terms (and RoPE, no term), so one
lowering per program and platform covers them all: the training step (forward,
backward, optimizer, the task's batch), the evaluation forward and greedy decoding
through the KV cache (traced offsets). A term that cannot lower fails here with
its platform and the lowering error. A hybrid (``model.layer_types``: every
recurrent mixer beside attention) lowers the same three programs, the kernel
in its attention layers and the recurrent scans, chunked and step by step, as
XLA around it.
"""

from __future__ import annotations

import importlib.util
import os
import warnings

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from posenc.model import ENCODINGS, fused
from posenc.model.encoding import overrides
from posenc.training import decode, loop, prepare
from posenc.training import step as step_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TERM_KINDS = tuple(sorted(k for k, c in ENCODINGS.items() if overrides(c, "kernel_terms")))
KINDS = (*TERM_KINDS, "rope")
# jax.export platform -> (force_backend's name, abstract device kind, the kernel's custom call)
PLATFORMS = {"cuda": ("gpu", "NVIDIA H100", "__gpu$xla.gpu.triton"),
             "tpu": ("tpu", "TPU v5 lite", "tpu_custom_call")}
PROGRAMS = ("train", "eval", "decode")
KERNELS = {"train": ("posenc_flash_fwd", "posenc_flash_dq", "posenc_flash_dkv"),
           "eval": ("posenc_flash_fwd",), "decode": ("posenc_flash_fwd",)}


def _config():
    module = importlib.import_module("posenc.configs.default")
    c = module.get_config("tiny")
    c.model.update(attention_impl="pallas", dtype="auto", num_layers=len(KINDS), num_heads=4,
                   num_kv_heads=2)
    c.model.position.layer_kinds = KINDS
    # Small term programs: the kernel unrolls T5's buckets and FIRE's hidden units.
    c.model.position.t5.update(num_buckets=8, max_distance=16)
    c.model.position.fire.hidden = 4
    return c


# every recurrent mixer, an attention layer and Falcon-H1's attention beside Mamba-2
HYBRID = ("mamba2", "attention", "gated_deltanet", "kda", "short_conv", "parallel_mamba2")


def _hybrid_config():
    module = importlib.import_module("posenc.configs.default")
    c = module.get_config("tiny")
    c.model.update(attention_impl="pallas", dtype="auto", num_layers=len(HYBRID), num_heads=4, num_kv_heads=2,
                   layer_types=HYBRID)
    for kind in ("mamba2", "gated_deltanet", "kda"):  # the scans cross chunks
        c.model.recurrent[kind].chunk_size = 4
    return c


def _mesh(platform):
    from jax._src.mesh import AbstractDevice, AbstractMesh

    _, kind, _ = PLATFORMS[platform]
    device = AbstractDevice(device_kind=kind, num_cores=1, platform=PLATFORMS[platform][0])
    return AbstractMesh((1,), ("x",), (jax.sharding.AxisType.Auto,), abstract_device=device)


def _shapes(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


def lower(platform, program, config=_config):
    """The MLIR text of ``program`` ("train" | "eval" | "decode") lowered for ``platform`` (``config()``:
    the run's config)."""
    from jax import export

    backend = PLATFORMS[platform][0]
    step_lib.clear_cache()  # the step's jit traces inside force_backend, and is dropped after
    try:
        with fused.force_backend(backend):
            r = prepare.resolve(config())
            assert r.spec.dtype == "bfloat16" and r.spec.attention_impl == "pallas"
            model, _, graphdef, state = loop.init_state(r)
            length = int(r.config.task.train_length)
            if program == "train":
                fn = step_lib.train_step_fn(r.train)
                args = (graphdef, _shapes(state), jax.ShapeDtypeStruct((), jax.random.key(0).dtype))
            else:
                mgraph, mstate = nnx.split(model)
                tokens = jax.ShapeDtypeStruct((2, length), jnp.int32)
                if program == "eval":
                    fn = jax.jit(lambda g, s, t: nnx.merge(g, s)(t, jnp.arange(length)[None]))
                    args = (mgraph, _shapes(mstate), tokens)
                else:
                    fn = jax.jit(lambda g, s, p: decode._greedy(g, s, p, jnp.arange(2 * length),
                                                                answer_length=length))
                    args = (mgraph, _shapes(mstate), tokens)
            disabled = [export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")]
            with jax.sharding.use_abstract_mesh(_mesh(platform)), warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # the Pallas Triton backend notice
                try:
                    exp = export.export(fn, platforms=[platform], disabled_checks=disabled)(*args)
                except Exception as e:  # the platform and the reason, in the failure's first line
                    raise AssertionError(f"{program} does not lower for {platform}: "
                                         f"{type(e).__name__}: {str(e)[:2000]}") from e
            return exp.mlir_module()
    finally:
        step_lib.clear_cache()


@pytest.mark.smoke
@pytest.mark.parametrize("program", PROGRAMS)
@pytest.mark.parametrize("platform", sorted(PLATFORMS))
def test_decoder_programs_lower_to_the_compiled_kernel(platform, program):
    text = lower(platform, program)
    target = PLATFORMS[platform][2]
    for name in KERNELS[program]:
        assert name in text, (platform, program, name)
    # every layer's attention is a kernel call (one layer of each kind), no XLA fallback; decoding
    # calls it in the prompt's pass and in the loop's body
    per_layer = len(KERNELS[program]) * (2 if program == "decode" else 1)
    assert text.count(f"@{target}") == len(KINDS) * per_layer, (platform, program)


@pytest.mark.parametrize("program", PROGRAMS)
@pytest.mark.parametrize("platform", sorted(PLATFORMS))
def test_hybrid_programs_lower_with_the_kernel_in_their_attention_layers(platform, program):
    text = lower(platform, program, config=_hybrid_config)
    for name in KERNELS[program]:
        assert name in text, (platform, program, name)
    per_layer = len(KERNELS[program]) * (2 if program == "decode" else 1)
    attending = sum(t in ("attention", "parallel_mamba2") for t in HYBRID)
    assert text.count(f"@{PLATFORMS[platform][2]}") == attending * per_layer, (platform, program)


# ---------------------------------------------------------------- compiled for a TPU (libtpu)

def _tpu_mesh(generation):
    """A mesh of one TPU of ``generation`` ("v5e" | "v6e") from libtpu's topology, or skip."""
    pytest.importorskip("libtpu", reason="libtpu is not installed (pip install -e '.[crosscompile]')")
    import numpy as np
    from jax.experimental import topologies

    # libtpu's lockfile admits one process per host; test workers and compiles share it
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    topo = topologies.get_topology_desc(f"{generation}=1x1", platform="tpu")
    return jax.sharding.Mesh(np.array(topo.devices), ("x",))


@pytest.mark.parametrize("generation,program", [("v5e", "train"), ("v6e", "decode")])
def test_decoder_programs_compile_for_a_tpu(generation, program):
    """XLA:TPU compiles the whole program (kernels, layout, fusion, memory), not only lowers it."""
    mesh = _tpu_mesh(generation)
    rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    step_lib.clear_cache()
    try:
        with fused.force_backend("tpu"):
            r = prepare.resolve(_config())
            model, _, graphdef, state = loop.init_state(r)
            length = int(r.config.task.train_length)
            placed = lambda t: jax.tree.map(  # noqa: E731
                lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=rep), t)
            if program == "train":
                fn = step_lib.train_step_fn(r.train)
                args = (graphdef, placed(state),
                        jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=rep))
            else:
                mgraph, mstate = nnx.split(model)
                fn = jax.jit(lambda g, s, p: decode._greedy(g, s, p, jnp.arange(2 * length),
                                                            answer_length=length))
                args = (mgraph, placed(mstate),
                        jax.ShapeDtypeStruct((2, length), jnp.int32, sharding=rep))
            with jax.sharding.set_mesh(mesh):
                try:
                    compiled = fn.lower(*args).compile()
                except Exception as e:
                    raise AssertionError(f"{program} does not compile for TPU {generation}: "
                                         f"{type(e).__name__}: {str(e)[:2000]}") from e
    finally:
        step_lib.clear_cache()
    text = compiled.as_text()
    assert "tpu_custom_call" in text and "posenc_flash_fwd" in text
    assert compiled.memory_analysis().temp_size_in_bytes > 0
