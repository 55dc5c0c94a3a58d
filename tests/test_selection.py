"""Evaluation during training and the checkpoint chosen on it (train.eval_every, train.select_length).

The official rule (HanseulJo/position-coupling ``run.py``) is transcribed:
after every epoch's evaluation, ``if save and phase == 'val_long' and
min_val_loss > losses['val_long'][-1]``: the model is saved as the best, so a
strictly lower val_long loss replaces it and a tie keeps the earlier one; the
last model is saved at the end. A run's rows must report the state of that
rule's step (``checkpoint`` best_long_val) beside the last one.
"""

import jax
import numpy as np
import pytest

from posenc.configs import default
from posenc.studies import compare_report
from posenc.training import loop, multiseed, prepare, selection, steploop
from posenc.workdir import files, records


def official_best(val_long_losses):
    """The epoch (0-based) whose model ``run.py`` keeps as ``best_*.pt``."""
    min_val_loss, best = 1e10, None
    for epoch, loss in enumerate(val_long_losses):
        if min_val_loss > loss:
            min_val_loss, best = loss, epoch
    return best


class _Ckpt:
    def __init__(self):
        self.saved = {}

    def all_steps(self):
        return sorted(self.saved)

    def save(self, s, state, record):
        self.saved[s] = (state, record)


@pytest.mark.parametrize("losses", [[3.0, 2.0, 2.5, 1.0, 1.5], [2.0, 2.0, 2.0], [1.0, 2.0, 3.0], [5.0, 4.0, 4.0, 3.9]])
def test_the_selection_rule_is_the_official_one(tmp_path, losses):
    c = _config(eval_every=10, select_length=22)
    evals = selection.Evaluations(prepare.resolve(c).config, str(tmp_path), main=True)
    evals.ckpt = _Ckpt()
    record = records.CheckpointRecord()
    for i, loss in enumerate(losses):
        rows = [{"eval_length": 16, "loss": 0.1}, {"eval_length": 22, "loss": loss}]
        evals.add(10 * (i + 1), rows, record, lambda i=i: f"state {i}")
    best = official_best(losses)
    assert record.selected == {"step": 10 * (best + 1), "loss": losses[best], "eval_length": 22}
    assert evals.ckpt.saved[10 * (best + 1)][0] == f"state {best}"
    assert [r["step"] for r in files.read_jsonl(str(tmp_path / "eval_log.jsonl"))] == [
        10 * (i + 1) for i in range(len(losses)) for _ in (16, 22)]


def test_the_schedule_evaluates_every_eval_every_steps_and_at_the_end():
    sched = steploop.Schedule(steps=25, end=25, log_every=100, checkpoint_every=100, eval_every=10)
    assert [s for s in range(1, 26) if sched.at(s).evaluate] == [10, 20, 25]
    assert sched.next_stop(0) == 10 and sched.next_stop(20) == 25
    assert not any(steploop.Schedule(steps=25, end=25, log_every=5, checkpoint_every=5).at(s).evaluate
                   for s in range(1, 26))


def _config(**train):
    c = default.get_config()
    c.task.name = "addition"
    c.task.options = {"format": "reversed", "zero_pad": True}
    c.task.train_length = 16  # 4 digits
    c.eval.lengths = (16, 22)  # 4 and 6 digits
    c.eval.update(batch_size=8, num_batches=1, decode=False)
    c.model.update(d_model=16, num_layers=1, num_heads=2)
    c.train.update(steps=12, batch_size=8, warmup_steps=1, log_every=4, checkpoint_every=8, progress=False,
                   learning_rate=3e-2, **train)
    return c


def _plain(x):
    return np.asarray(jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x)


def _check_run(rows, workdir, steps):
    log = files.read_jsonl(f"{workdir}/eval_log.jsonl")
    assert sorted({r["step"] for r in log}) == [4, 8, 12]
    at = {r["step"]: r["loss"] for r in log if r["eval_length"] == 22}
    chosen = official_best([at[s] for s in sorted(at)])
    by = {(r["checkpoint"], r["eval_length"]): r for r in rows}
    assert set(by) == {(c, n) for c in ("last", "best_long_val") for n in (16, 22)}
    best = by[("best_long_val", 22)]
    assert best["selected_step"] == sorted(at)[chosen]
    assert best["selected_loss"] == pytest.approx(at[best["selected_step"]])
    if best["selected_step"] == steps:  # the last state chosen: the same numbers
        assert best["loss"] == pytest.approx(by[("last", 22)]["loss"])
    return by


def test_a_run_reports_the_last_and_the_selected_state_and_resumes_to_the_same(tmp_path):
    c = _config(eval_every=4, select_length=22)
    straight = loop.run(c, str(tmp_path / "a"))
    by = _check_run(straight, tmp_path / "a", 12)
    assert loop.run(c, str(tmp_path / "b"), max_steps_this_run=9) is None  # stopped (checkpointed) at step 9
    resumed = loop.run(c, str(tmp_path / "b"))
    assert files.read_jsonl(tmp_path / "a" / "eval_log.jsonl") == files.read_jsonl(tmp_path / "b" / "eval_log.jsonl")
    for r in resumed:
        assert r["loss"] == by[(r["checkpoint"], r["eval_length"])]["loss"]
    # the selected state is the state of its step: a run of exactly that many steps ends there
    step = by[("best_long_val", 22)]["selected_step"]
    ckpt = loop.init_state(prepare.resolve(c))[3]
    chosen = selection.Evaluations(prepare.resolve(c).config, str(tmp_path / "a"), main=True)
    restored = chosen.selected(ckpt, records.CheckpointRecord(selected={"step": step, "loss": 0.0}))
    chosen.close()
    book = records.RunLog(prepare.resolve(c).config, str(tmp_path / "a"), main=False)
    if step in book.ckpt.all_steps():
        saved, _ = book.ckpt.restore(loop.init_state(prepare.resolve(c))[3], step=step)
        for x, y in zip(jax.tree.leaves(saved), jax.tree.leaves(restored)):
            np.testing.assert_array_equal(_plain(x), _plain(y))
    book.close()
    # complete: a second call returns the rows without training
    assert len(loop.run(c, str(tmp_path / "a"))) == 4


def test_seeds_trained_together_select_each_their_own(tmp_path):
    configs = [_config(eval_every=4, select_length=22, seed=s) for s in (0, 1)]
    out = multiseed.run_seeds(configs, [str(tmp_path / f"s{s}") for s in (0, 1)])
    for s, rows in enumerate(out):
        _check_run(rows, tmp_path / f"s{s}", 12)
    one = loop.run(configs[0], str(tmp_path / "alone"))
    alone = {(r["checkpoint"], r["eval_length"]): r for r in one}
    for r in out[0]:
        assert r["selected_step" if r["checkpoint"] == "best_long_val" else "eval_length"] == alone[
            (r["checkpoint"], r["eval_length"])]["selected_step" if r["checkpoint"] == "best_long_val"
                                                  else "eval_length"]
        assert r["loss"] == pytest.approx(alone[(r["checkpoint"], r["eval_length"])]["loss"], rel=1e-4)


def test_the_table_labels_the_selected_rows():
    rows = [dict(task="addition", position="rope", norm="rms", placement="pre", seed=0, train_length=16,
                 eval_length=16, loss=1.0, accuracy=0.5, exact_match=0.1, steps=4, config_hash="a" * 64,
                 checkpoint=c) for c in ("last", "best_long_val")]
    md = compare_report.table_markdown(rows)
    assert "| rope [best_long_val] |" in md and "| rope |" in md and "[best_long_val]: the parameters" in md


def test_bad_selection_fields_are_refused_before_compiling():
    with pytest.raises(prepare.ConfigError, match="train.select_length=22 chooses .* needs train.eval_every > 0"):
        prepare.resolve(_config(select_length=22))
    with pytest.raises(prepare.ConfigError, match=r"train.select_length=30 must be one of eval.lengths \(16, 22\)"):
        prepare.resolve(_config(eval_every=4, select_length=30))
    assert selection.checkpoints(prepare.resolve(_config()).config) == (None,)
