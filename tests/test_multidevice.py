"""Many-device training on fake CPU devices: data parallel and FSDP match one device; checkpoints
move between device counts.

JAX fixes the device count when it starts, and the rest of the suite runs on
one device, so the work happens in two subprocesses of this file
(``python tests/test_multidevice.py WORKER DIR``): ``four`` with
``JAX_NUM_CPU_DEVICES=4``, then ``one`` with a single device. They share one
tiny config, and the parity runs call the loop's own compiled chunk of steps, so the loop's
runs that follow compile nothing more. ``POSENC_TEST_MULTIPROCESS=1`` adds a real
two-process run (``jax.distributed`` over localhost, 2 x 2 CPU devices).
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PARITY_STEPS = 3


def S(*axes):
    """The string of ``PartitionSpec(*axes)`` (workers report shardings as text)."""
    from jax.sharding import PartitionSpec

    return str(PartitionSpec(*axes))


# --------------------------------------------------------------------------- workers


def _config(fsdp=False):
    import importlib.util

    module = importlib.import_module("posenc.configs.default")
    c = module.get_config("tiny")
    c.train.update(steps=6, warmup_steps=2, log_every=3, checkpoint_every=3, learning_rate=3e-3)
    c.eval.update(lengths=(16,), num_batches=1)
    c.mesh.fsdp = fsdp
    return c


def _leaves(state) -> dict:
    import jax

    out = {}
    for path, x in jax.tree.leaves_with_path(state):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        out[jax.tree_util.keystr(path)] = np.asarray(x)
    return out


def _fresh_state(resolved):
    from posenc.training import loop

    _, _, graphdef, state = loop.init_state(resolved)
    return graphdef, state


def _train_steps(config, steps):
    """``steps`` steps of the jitted train step as the loop runs it; (losses, final state, mesh)."""
    import jax

    from posenc.training import loop, prepare, sharding
    from posenc.training import step as step_lib

    r = prepare.resolve(config)
    config = r.config
    graphdef, state = _fresh_state(r)
    mesh = sharding.mesh_or_none(config)
    if mesh is None:
        fn = step_lib.train_step_fn(r.train)
    else:
        state = sharding.shard_state(state, mesh, fsdp=sharding.fsdp_enabled(config))
        fn = step_lib.train_step_fn(r.train, mesh=mesh)
    root = jax.random.fold_in(jax.random.key(int(config.train.seed)), loop.DATA_STREAM)
    losses = []
    for t in range(steps):
        key = jax.random.fold_in(root, t)
        state, metrics = fn(graphdef, state, key if mesh is None else sharding.replicate(key, mesh))
        losses.append(float(metrics["loss"]))
    return losses, state


def _train_chunk(config, steps):
    """``steps`` steps in one call of the jitted chunk (on the mesh, if any); (losses, final state).

    The chunk is the loop's own program (its buffer size), so a later ``loop.run`` of the same
    config calls it without compiling again."""
    import jax

    from posenc.training import loop, prepare, sharding, steploop
    from posenc.training import step as step_lib

    r = prepare.resolve(config)
    graphdef, state = _fresh_state(r)
    mesh = sharding.mesh_or_none(r.config)
    place = (lambda x: x) if mesh is None else (lambda x: sharding.replicate(x, mesh))
    if mesh is not None:
        state = sharding.shard_state(state, mesh, fsdp=sharding.fsdp_enabled(r.config))
    fn = step_lib.train_chunk_fn(r.train, steploop.buffer_size(r.config), mesh=mesh)
    state, metrics = fn(graphdef, state, place(loop.data_root(r.config)), place(np.int32(0)),
                        place(np.int32(steps)))
    return [float(x) for x in jax.device_get(metrics["loss"])[:steps]], state


def _restore(config, directory):
    """The newest checkpoint in ``directory`` restored into this process's (sharded) state."""
    from posenc.training import prepare, sharding
    from posenc.workdir.checkpoint import Checkpointer

    r = prepare.resolve(config)
    config = r.config
    _, state = _fresh_state(r)
    mesh = sharding.mesh_or_none(config)
    if mesh is not None:
        state = sharding.shard_state(state, mesh, fsdp=sharding.fsdp_enabled(config))
    ckpt = Checkpointer(directory)
    state, record = ckpt.restore(state)
    ckpt.close()
    return state, record


def worker_four(out):
    import jax

    from posenc.training import loop, sharding
    from posenc.workdir.checkpoint import Checkpointer

    assert jax.device_count() == 4, jax.devices()
    report = {}
    # data parallel: single steps, then the same steps in one compiled call (bit-identical, sharded
    # alike); FSDP: the compiled chunk the loop runs (its single steps would only add a compile)
    dp_losses, dp_state = _train_steps(_config(), PARITY_STEPS)
    chunk_losses, chunk_state = _train_chunk(_config(), PARITY_STEPS)
    report["dp_chunk_identical"] = chunk_losses == dp_losses and all(
        np.array_equal(a, b) for a, b in zip(_leaves(dp_state).values(), _leaves(chunk_state).values()))
    report["dp_chunk_specs_same"] = all(
        str(a.sharding.spec) == str(b.sharding.spec)
        for a, b in zip(jax.tree.leaves(dp_state), jax.tree.leaves(chunk_state)))
    fsdp_losses, fsdp_state = _train_chunk(_config(True), PARITY_STEPS)
    for name, losses, state in (("dp", dp_losses, dp_state), ("fsdp", fsdp_losses, fsdp_state)):
        report[f"{name}_losses"] = losses
        np.savez(os.path.join(out, f"{name}.npz"), **_leaves(state))
        report[f"{name}_specs"] = {k: str(getattr(x.sharding, "spec", None))
                                   for k, x in ((jax.tree_util.keystr(p), x)
                                                for p, x in jax.tree.leaves_with_path(state))}
    # (c) a 4-device FSDP run stopped after step 3: its checkpoint is continued on 1 device
    assert loop.run(_config(True), os.path.join(out, "run4"), max_steps_this_run=3) is None
    state, record = _restore(_config(True), os.path.join(out, "run4", "checkpoints"))
    report["ckpt4_step"] = record["step"]
    np.savez(os.path.join(out, "ckpt4.npz"), **_leaves(state))
    # 1 -> 4: a state on one device (as a 1-device run saves it) restores FSDP-sharded
    from posenc.training import prepare

    resolved = prepare.resolve(_config(True))
    config = resolved.config
    _, single = _fresh_state(resolved)
    ckpt = Checkpointer(os.path.join(out, "ckpt1"))
    ckpt.save(0, single, {"step": 0})
    ckpt.close()
    restored, _ = _restore(_config(True), os.path.join(out, "ckpt1"))
    mesh = sharding.make_mesh(config)
    same = all(np.array_equal(a, b) for a, b in zip(_leaves(single).values(), _leaves(restored).values()))
    report["one_to_four_equal"] = same
    report["one_to_four_specs"] = sorted({str(x.sharding.spec) for x in jax.tree.leaves(restored)
                                          if x.sharding.mesh == mesh})
    # (d) batch sizes that do not split over 4 devices
    errors = {}
    for field in ("train", "eval"):
        c = _config()
        c[field].batch_size = 6
        try:
            loop.run(c, os.path.join(out, f"bad_{field}"))
        except ValueError as e:
            errors[field] = str(e)
        # refused before claiming the workdir
        errors[field + "_config_written"] = os.path.exists(os.path.join(out, f"bad_{field}", "config.json"))
    report["errors"] = errors
    with open(os.path.join(out, "four.json"), "w") as f:
        json.dump(report, f)


def worker_one(out):
    import jax

    from posenc.training import loop
    from posenc.workdir.checkpoint import Checkpointer

    assert jax.device_count() == 1, jax.devices()
    report = {}
    losses, state = _train_chunk(_config(True), PARITY_STEPS)  # the program of the loop's runs below
    report["losses"] = losses
    np.savez(os.path.join(out, "one.npz"), **_leaves(state))
    state, record = _restore(_config(True), os.path.join(out, "run4", "checkpoints"))
    report["ckpt_step"] = record["step"]
    report["ckpt_devices"] = sorted({str(d) for x in jax.tree.leaves(state) for d in x.devices()})
    np.savez(os.path.join(out, "ckpt1_restored.npz"), **_leaves(state))
    # continue the 4-device run here, and run the same config uninterrupted on 1 device
    resumed = loop.run(_config(True), os.path.join(out, "run4"))
    straight = loop.run(_config(True), os.path.join(out, "run1"))
    report["resumed_rows"], report["straight_rows"] = resumed, straight
    for name in ("run4", "run1"):
        ckpt = Checkpointer(os.path.join(out, name, "checkpoints"))
        report[f"{name}_steps"] = ckpt.all_steps()
        ckpt.close()
        state, _ = _restore(_config(True), os.path.join(out, name, "checkpoints"))
        np.savez(os.path.join(out, f"{name}_final.npz"), **_leaves(state))
    with open(os.path.join(out, "one.json"), "w") as f:
        json.dump(report, f, default=str)


# --------------------------------------------------------------------------- tests


def _spawn(worker, out, devices):
    env = dict(os.environ, JAX_NUM_CPU_DEVICES=str(devices), JAX_PLATFORMS="cpu",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("XLA_FLAGS", None)  # a forced host device count would override JAX_NUM_CPU_DEVICES
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), worker, str(out)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{worker} worker failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    with open(os.path.join(out, f"{worker}.json")) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("multidevice")
    four = _spawn("four", out, 4)
    one = _spawn("one", out, 1)
    return out, four, one


def _assert_states_close(a_path, b_path, rtol=1e-5, atol=1e-6):
    # atol: Adam's second moments are ~1e-8; only the order of the gradient all-reduce differs
    a, b = np.load(a_path), np.load(b_path)
    assert sorted(a.files) == sorted(b.files)
    assert any("embedding" in k for k in a.files)
    for k in a.files:
        np.testing.assert_allclose(a[k], b[k], rtol=rtol, atol=atol, err_msg=k)


def test_data_parallel_matches_one_device(runs):
    out, four, one = runs
    np.testing.assert_allclose(four["dp_losses"], one["losses"], rtol=1e-5)
    assert len(set(one["losses"])) == PARITY_STEPS  # the steps really trained
    _assert_states_close(out / "dp.npz", out / "one.npz")
    # data parallel: every array replicated
    assert set(four["dp_specs"].values()) == {S()}
    # k steps per compiled call on the mesh: the single steps' results, bit for bit
    assert four["dp_chunk_identical"] and four["dp_chunk_specs_same"]


def test_fsdp_matches_one_device_and_shards_parameters(runs):
    out, four, one = runs
    np.testing.assert_allclose(four["fsdp_losses"], one["losses"], rtol=1e-5)
    _assert_states_close(out / "fsdp.npz", out / "one.npz")
    specs = four["fsdp_specs"]
    w1 = [k for k in specs if "mlp" in k and "w1" in k and "opt_state" not in k]
    assert w1 and specs[w1[0]] == S(None, "data")  # [32, 128]: the 128 axis
    mu = [k for k in specs if "mu" in k and "w1" in k]
    assert mu and specs[mu[0]] == specs[w1[0]]  # Adam moments sharded like their parameter
    emb = [k for k in specs if k.endswith("['embedding'].value") and "opt_state" not in k]
    assert emb and specs[emb[0]] != S()
    step = [k for k in specs if k.endswith("['step'].value")]
    assert step and specs[step[0]] == S()  # scalars stay replicated


def test_checkpoint_from_four_devices_continues_on_one(runs):
    out, four, one = runs
    assert four["ckpt4_step"] == one["ckpt_step"] == 3
    assert one["ckpt_devices"] == ["cpu:0"]
    a, b = np.load(out / "ckpt4.npz"), np.load(out / "ckpt1_restored.npz")
    for k in a.files:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)  # restored bit for bit
    assert one["run4_steps"] == one["run1_steps"] == [3, 6]
    _assert_states_close(out / "run4_final.npz", out / "run1_final.npz")
    (resumed,), (straight,) = one["resumed_rows"], one["straight_rows"]
    assert resumed["config_hash"] == straight["config_hash"]  # mesh fields are not the experiment
    for k in ("loss", "accuracy", "train_loss"):
        np.testing.assert_allclose(resumed[k], straight[k], rtol=1e-5, err_msg=k)


def test_checkpoint_from_one_device_restores_sharded_on_four(runs):
    _, four, _ = runs
    assert four["one_to_four_equal"]
    assert S("data") in four["one_to_four_specs"]
    assert S() in four["one_to_four_specs"]


def test_batch_size_not_divisible_by_devices_is_an_error(runs):
    _, four, _ = runs
    assert "train.batch_size=6 is not divisible by the 4 data-parallel devices" in four["errors"]["train"]
    assert "eval.batch_size=6 is not divisible by the 4 data-parallel devices" in four["errors"]["eval"]
    assert not four["errors"]["train_config_written"] and not four["errors"]["eval_config_written"]


@pytest.mark.skipif(os.environ.get("POSENC_TEST_MULTIPROCESS") != "1",
                    reason="two JAX processes (~30 s on 2 cores); set POSENC_TEST_MULTIPROCESS=1")
def test_two_processes_match_one_device(runs):
    """``python -m posenc train --distributed``: 2 processes x 2 CPU devices, FSDP, equal to 1 device."""
    import socket

    out, _, one = runs
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        port = sock.getsockname()[1]
    workdir = out / "two_processes"
    overrides = ["--config.train.steps=6", "--config.train.warmup_steps=2", "--config.train.log_every=3",
                 "--config.train.checkpoint_every=3", "--config.train.learning_rate=3e-3",
                 "--config.eval.lengths=(16,)", "--config.eval.num_batches=1", "--config.mesh.fsdp=True"]
    env = dict(os.environ, JAX_NUM_CPU_DEVICES="2", JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    procs = [subprocess.Popen(
        [sys.executable, "-m", "posenc", "train", "--config=default:tiny", *overrides,
         f"--workdir={workdir}", "--jax_cache_dir=", "--distributed",
         f"--coordinator_address=localhost:{port}", "--num_processes=2", f"--process_id={i}"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]
    logs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(log[-3000:] for log in logs)
    (row,) = [json.loads(line) for line in open(workdir / "results.jsonl")]
    (straight,) = one["straight_rows"]
    assert row["config_hash"] == straight["config_hash"]
    for k in ("loss", "accuracy", "train_loss"):
        np.testing.assert_allclose(row[k], straight[k], rtol=1e-5, err_msg=k)
    assert "| rope |" in logs[0] and "| rope |" not in logs[1]  # only process 0 reports


def test_one_device_uses_no_mesh():
    import importlib

    sharding = importlib.import_module("posenc.training.sharding")
    c = _config()
    if sharding.num_devices(c) == 1:
        assert sharding.mesh_or_none(c) is None
    c.mesh.data = 99
    with pytest.raises(ValueError, match=r"mesh.data=99 is not available; choose -1"):
        sharding.num_devices(c)


def test_initialize_distributed_checks_process_ids():
    from posenc.training.sharding import initialize_distributed

    # checked before JAX is contacted, so nothing is initialised here
    with pytest.raises(ValueError, match=r"process_id=2 is out of range; choose one of 0..1"):
        initialize_distributed(coordinator_address="localhost:1", num_processes=2, process_id=2)
    with pytest.raises(ValueError, match=r"num_processes must be >= 1, got 0"):
        initialize_distributed(coordinator_address="localhost:1", num_processes=0, process_id=0)


def test_fsdp_spec_rule():
    from jax.sharding import PartitionSpec as P

    from posenc.training.sharding import spec_for

    assert spec_for((32, 128), 4, fsdp=True) == P(None, "data")  # largest divisible axis
    assert spec_for((20, 32), 4, fsdp=True) == P(None, "data")  # 20 divides, 32 is larger
    assert spec_for((128, 128), 4, fsdp=True) == P("data")  # ties: the first axis
    assert spec_for((6, 3), 4, fsdp=True) == P()  # nothing divides: replicated
    assert spec_for((), 4, fsdp=True) == P()
    assert spec_for((32, 128), 4, fsdp=False) == P()


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    {"four": worker_four, "one": worker_one}[sys.argv[1]](sys.argv[2])
