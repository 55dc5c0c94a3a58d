"""Benchmarks of whole jobs: the quick grids' per-step times and the main job's wall time.

    python -m benchmarks.benchmark --config benchmarks/cases.py:quick_grids
    python -m benchmarks.benchmark --config benchmarks/cases.py:main

``quick_grids``: for each grid of ``bench.grids`` (the compare config), one
cell per task (rope, or the grid's first position; the first placement and
norm), trained on its own task as the grid trains it: the compiled chunk of
the step loop, the seeds vmapped where the grid sets ``grid.vmap_seeds``;
rows give the step time (median over calls of k steps, k by the loop's
"auto" rule) and the time of a call of one step (the probe's).

``main``: ``python -m posenc compare --config compare:quick``
twice, each in a fresh process, with its own compilation cache directory
under ``bench.main_workdir``: first empty (cold), then as the first run
left it (warm); rows give the wall and CPU time of each run and the load.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import time


def _grid_cells(grid_name: str):
    """``[(task variant, position, config)]``: one cell per task of a quick grid, with rope
    (or the grid's first position), the grid's first placement and norm."""
    from posenc.config import overrides
    from posenc.configs import compare
    from posenc.training import prepare

    g = compare.get_config(grid_name)
    positions = list(g.grid.positions)
    position = "rope" if "rope" in positions else positions[0]
    cells = []
    for task in g.grid.tasks:
        run = prepare.plain_copy(g.base)
        for axis, field, entry in (("tasks", "task.name", task), ("positions", "model.position.kind", position),
                                   ("placements", "model.norm.placement", g.grid.placements[0]),
                                   ("norms", "model.norm.kind", g.grid.norms[0])):
            fields = (overrides.as_dict(g.variants[entry]) if isinstance(entry, str) and entry in g.variants
                      else {field: entry})
            overrides.apply(run, fields, where=f"grid.{axis} entry {entry!r}")
        cells.append((task, position, prepare.resolve(run), len(g.grid.seeds) if g.grid.vmap_seeds else 1))
    return cells


def quick_grids(config, emit):
    """Per-step time of each quick grid's models on their own tasks, k steps per call."""
    import jax
    import numpy as np

    from posenc.training import loop, multiseed, steploop
    from posenc.training import step as step_lib

    for grid in config.bench.grids:
        for task, position, r, seeds in _grid_cells(grid):
            c = r.config
            states = [loop.init_state(r)[2:] for _ in range(seeds)]
            graphdef = states[0][0]
            if seeds > 1:
                fn = step_lib.seeds_train_chunk_fn(r.train, steploop.AUTO_MAX)
                state = multiseed._stack([s for _, s in states])
                data = jax.random.split(jax.random.key(0), seeds)
            else:
                fn = step_lib.train_chunk_fn(r.train, steploop.AUTO_MAX)
                state, data = states[0][1], jax.random.key(0)
            t = time.perf_counter()
            state, m = fn(graphdef, state, data, np.int32(0), np.int32(1))
            jax.block_until_ready(m)
            compile_s = time.perf_counter() - t
            box, single = [state, 1], []

            def call(n):
                t = time.perf_counter()
                box[0], m = fn(graphdef, box[0], data, np.int32(box[1]), np.int32(n))
                jax.block_until_ready(m)
                box[1] += n
                if n == 1:
                    single.append(time.perf_counter() - t)

            k = steploop.probe_steps_per_call(call)
            state, step, times = box[0], box[1], []
            for _ in range(max(3, -(-int(config.bench.steps) // k))):
                t = time.perf_counter()
                state, m = fn(graphdef, state, data, np.int32(step), np.int32(k))
                jax.block_until_ready(m)
                times.append((time.perf_counter() - t) / k)
                step += k
            emit(dict(case="quick_grids", grid=grid, task=task, position=position, seeds=seeds,
                       batch_size=int(c.train.batch_size), train_length=int(c.task.train_length),
                       d_model=int(c.model.d_model), num_layers=int(c.model.num_layers),
                       steps_per_call=k, step_ms=round(1e3 * statistics.median(times), 3),
                       step_ms_single_call=round(1e3 * statistics.median(single), 3),
                       compile_s=round(compile_s, 2), load_1min=round(os.getloadavg()[0], 2)))


def main_job(config, emit):
    """The main job twice, each in a fresh process: an empty compilation cache, then the warm one."""
    import shutil

    root = config.bench.main_workdir
    if os.path.exists(root):
        shutil.rmtree(root)
    cache = os.path.join(root, "jax_cache")
    for name in ("cold", "warm"):
        argv = [sys.executable, "-m", "posenc", "compare", "--config", "compare:quick",
                "--workdir", os.path.join(root, name), f"--jax_cache_dir={cache}",
                *config.bench.main_args]
        load0, t = os.getloadavg()[0], time.perf_counter()
        usage0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        out = subprocess.run(argv, capture_output=True, text=True)
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        entries = sum(len(f) for _, _, f in os.walk(cache))
        emit(dict(case="main", cache=name, wall_s=round(time.perf_counter() - t, 1),
                   cpu_s=round(usage.ru_utime + usage.ru_stime - usage0.ru_utime - usage0.ru_stime, 1),
                   returncode=out.returncode, cache_entries=entries,
                   load_1min_before=round(load0, 2), load_1min_after=round(os.getloadavg()[0], 2),
                   **({"error": out.stderr.strip().splitlines()[-1]} if out.returncode else {})))
