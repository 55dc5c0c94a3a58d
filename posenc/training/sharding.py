"""Data-parallel and FSDP training over a one-axis device mesh (JAX's own sharding).

The mesh has one axis, ``"data"``, over ``config.mesh.data`` devices (-1: all
devices of all processes). The batch, generated inside the jitted step from
its key, is constrained to ``P("data")`` along its leading (example) axis, so
each device generates and uses ``batch_size / n`` examples; XLA inserts the
all-reduces of the loss and the gradients. The state of ``(model,
optimizer)`` is placed by :func:`state_shardings`:

  data parallel (``mesh.fsdp=False``): every array replicated;
  FSDP (``mesh.fsdp=True``): every array sharded along its largest axis whose
  size divides by ``n`` (first such axis on ties), replicated if none does.
  A parameter and its Adam moments have the same shape, so they are sharded
  alike; XLA gathers a parameter where it is used (ZeRO-3 / FSDP).

The maths is that of one device: the same batch (threefry random bits do
not depend on the sharding) and the same loss, only the order of the
reductions changes, so losses agree to float32 rounding. With one device
the loop uses no mesh at all (:func:`mesh_or_none`).
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

AXIS = "data"


def _mesh_settings(config) -> tuple[int, bool]:
    mesh = config.get("mesh") if hasattr(config, "get") else None
    if mesh is None:
        return -1, False
    return int(mesh.get("data", -1)), bool(mesh.get("fsdp", False))


def num_devices(config) -> int:
    """Devices of the data axis: ``config.mesh.data`` (-1: ``jax.device_count()``, all processes)."""
    data, _ = _mesh_settings(config)
    available = jax.device_count()
    if data == -1:
        return available
    if not 1 <= data <= available:
        raise ValueError(f"mesh.data={data} is not available; choose -1 (all {available} devices) "
                         f"or a count in [1, {available}]")
    return data


def fsdp_enabled(config) -> bool:
    """``config.mesh.fsdp`` (False when the config has no ``mesh``)."""
    return _mesh_settings(config)[1]


def make_mesh(config) -> jax.sharding.Mesh:
    """A ``("data",)`` mesh of :func:`num_devices` devices (global devices when multi-host).

    The axis is ``AxisType.Auto``: shardings are placed on the state and the
    batch, and XLA propagates them through the model (no sharding in types).
    """
    n = num_devices(config)
    return jax.make_mesh((n,), (AXIS,), axis_types=(jax.sharding.AxisType.Auto,),
                         devices=jax.devices()[:n])


def mesh_or_none(config) -> jax.sharding.Mesh | None:
    """:func:`make_mesh`, or None on one device (today's single-device path, no sharding)."""
    return make_mesh(config) if num_devices(config) > 1 else None


def check_batch_size(batch_size: int, mesh, *, name: str = "train.batch_size") -> None:
    """ValueError unless ``batch_size`` divides evenly over the mesh's data-parallel devices."""
    if mesh is None:
        return
    n = int(mesh.shape[AXIS])
    if int(batch_size) % n:
        raise ValueError(f"{name}={int(batch_size)} is not divisible by the {n} data-parallel devices; "
                         f"choose a multiple of {n} or set mesh.data to a divisor of {int(batch_size)}")


def _is_key(x) -> bool:
    return hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def spec_for(shape, n: int, *, fsdp: bool) -> P:
    """PartitionSpec of an array of ``shape``: replicated, or (FSDP) its largest axis divisible by ``n``."""
    if not fsdp or n <= 1:
        return P()
    divisible = [(size, -axis) for axis, size in enumerate(shape) if size >= n and size % n == 0]
    if not divisible:
        return P()
    axis = -max(divisible)[1]
    return P(*([None] * axis + [AXIS]))


def state_shardings(state, mesh, *, fsdp: bool):
    """A ``NamedSharding`` per array leaf of ``state`` (shapes only; works on tracers too)."""
    n = int(mesh.shape[AXIS])

    def one(x):
        # PRNG keys (dropout streams) and scalars (step counts) stay replicated.
        spec = P() if _is_key(x) else spec_for(np.shape(x), n, fsdp=fsdp)
        return NamedSharding(mesh, spec)

    return jax.tree.map(one, state)


def place(x, sharding):
    """``x`` as an array with ``sharding``, also when it spans other processes' devices.

    ``jax.device_put`` only reaches this process's devices; with several
    processes every process holds the same host value (same seed, same
    step), so each builds its own shards from it.
    """
    if sharding.is_fully_addressable or (isinstance(x, jax.Array) and not x.is_fully_addressable):
        return jax.device_put(x, sharding)  # local, or already global: a no-op or a reshard
    if _is_key(x):
        data = place(jax.random.key_data(x), sharding)
        return jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
    host = np.asarray(x)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def shard_state(state, mesh, *, fsdp: bool):
    """``state`` placed on ``mesh``: replicated (data parallel) or sharded (FSDP)."""
    return jax.tree.map(place, state, state_shardings(state, mesh, fsdp=fsdp))


def constrain_state(state, mesh, *, fsdp: bool):
    """Inside jit: pin ``state`` to :func:`state_shardings` (the step returns what it received)."""
    return jax.lax.with_sharding_constraint(state, state_shardings(state, mesh, fsdp=fsdp))


def constrain_batch(batch, mesh):
    """Inside jit: shard every array of ``batch`` along its leading (example) axis."""
    sharding = NamedSharding(mesh, P(AXIS))
    return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, sharding), batch)


def replicate(x, mesh):
    """``x`` (e.g. a step key) replicated on every device of ``mesh``."""
    return place(x, NamedSharding(mesh, P()))


def initialize_distributed(*, coordinator_address: str | None = None, num_processes: int | None = None,
                           process_id: int | None = None) -> None:
    """``jax.distributed.initialize`` for a multi-process (multi-host) run; call before any JAX work.

    Unset arguments come from ``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES``
    and ``JAX_PROCESS_ID``; if still unset, JAX detects them itself (SLURM,
    Open MPI, Cloud TPU pods). Afterwards ``jax.devices()`` lists every
    process's devices and :func:`make_mesh` spans all of them.
    """
    import os

    coordinator_address = coordinator_address or os.environ.get("JAX_COORDINATOR_ADDRESS") or None
    if num_processes is None and os.environ.get("JAX_NUM_PROCESSES"):
        num_processes = int(os.environ["JAX_NUM_PROCESSES"])
    if process_id is None and os.environ.get("JAX_PROCESS_ID"):
        process_id = int(os.environ["JAX_PROCESS_ID"])
    if num_processes is not None and num_processes < 1:
        raise ValueError(f"num_processes must be >= 1, got {num_processes}")
    if num_processes is not None and process_id is not None and not 0 <= process_id < num_processes:
        raise ValueError(f"process_id={process_id} is out of range; choose one of 0..{num_processes - 1}")
    jax.distributed.initialize(coordinator_address=coordinator_address, num_processes=num_processes,
                               process_id=process_id)
