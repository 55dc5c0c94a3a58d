"""Evaluation during training, and the checkpoint chosen on it (``train.eval_every``, ``train.select_length``).

Cho et al. 2024 (HanseulJo/position-coupling ``run.py``) evaluate after every
epoch on ``val`` (the training digits) and ``val_long`` (their longest test
operands, 100 digits), keep the parameters of the lowest ``val_long`` loss
(``best_<model>.pt``) beside the last ones (``last_<model>.pt``) and report
the best: a checkpoint chosen on out-of-distribution data. Here:

* every ``train.eval_every`` steps, and at the last step, the model is
  evaluated teacher-forced on the run's validation stream (examples apart from
  the reported ones, as the fit check's) at every ``eval.lengths``: one row per
  length in ``WORKDIR/eval_log.jsonl`` (``step``, ``eval_length``,
  ``problem_size``, ``loss``, ``accuracy``, ``exact_match``); a resumed run
  keeps the rows up to its checkpoint and writes the later ones again;
* with ``train.select_length`` (one of ``eval.lengths``), the state of the
  lowest validation loss there so far is kept in ``WORKDIR/selected/`` (one
  checkpoint; its step and loss travel in the run's checkpoint records, so a
  resumed run compares against the same best), and the final evaluation scores
  it beside the last state: every row says which, ``checkpoint`` =
  :data:`LAST` or :data:`SELECTED`, the latter with ``selected_step`` and
  ``selected_loss``. A tie keeps the earlier step (strictly lower loss
  replaces, as the official ``min_val_loss > loss``).
"""

from __future__ import annotations

import math
import os

from posenc.workdir import files
from posenc.workdir.checkpoint import Checkpointer

LAST = "last"  # rows of the state at the end of training
SELECTED = "best_long_val"  # rows of the state of lowest validation loss at train.select_length
LOG_FILE = "eval_log.jsonl"
KEPT = ("eval_length", "problem_size", "loss", "accuracy", "exact_match")  # the fields of an eval_log row


def enabled(config) -> bool:
    """Whether ``config`` evaluates during training (``train.eval_every`` > 0)."""
    return int(config.train.get("eval_every", 0)) > 0


def selects(config) -> bool:
    """Whether ``config`` chooses a checkpoint besides the last (``train.select_length`` > 0)."""
    return int(config.train.get("select_length", 0)) > 0


def checkpoints(config) -> tuple:
    """The ``checkpoint`` values of a complete run's rows: (None,) or (LAST, SELECTED)."""
    return (LAST, SELECTED) if selects(config) else (None,)


class Evaluations:
    """One run's evaluations during training: its eval_log.jsonl and its selected checkpoint."""

    def __init__(self, config, workdir: str, *, main: bool):
        self.length = int(config.train.get("select_length", 0))
        self.path = os.path.join(workdir, LOG_FILE)
        self.main = main
        self.ckpt = Checkpointer(os.path.join(workdir, "selected"), max_to_keep=1) if self.length else None
        self.rows: list[dict] = []

    def restore(self, start: int) -> None:
        """Keep the logged rows up to step ``start`` (a resumed run logs the later ones again)."""
        self.rows = [r for r in files.read_jsonl(self.path) if r["step"] <= start]

    def add(self, s: int, rows, record, state_of) -> None:
        """Log the evaluation ``rows`` of step ``s``; keep ``state_of()`` if its loss at the
        selection length is the lowest so far (``record.selected``: the best's step and loss)."""
        self.rows += [{"step": int(s), **{k: r.get(k) for k in KEPT}} for r in rows]
        if self.main:
            files.write_jsonl(self.path, self.rows)
        if not self.length:
            return
        loss = next((r["loss"] for r in rows if int(r["eval_length"]) == self.length), None)
        if loss is None or not math.isfinite(loss):
            return
        best = record.selected
        if best is None or loss < best["loss"]:
            record.selected = {"step": int(s), "loss": float(loss), "eval_length": self.length}
            if int(s) not in self.ckpt.all_steps():  # a resumed run reaching it again: the same state
                self.ckpt.save(int(s), state_of(), dict(record.selected))

    def selected(self, template, record):
        """The selected state (restored into ``template``, a state of the same graph), or None when
        none was chosen (training stopped before the first evaluation)."""
        if not self.length or record.selected is None:
            return None
        state, _ = self.ckpt.restore(template, step=int(record.selected["step"]))
        return state

    def close(self) -> None:
        if self.ckpt is not None:
            self.ckpt.close()


def row_fields(record, steps_trained: int) -> dict:
    """The fields of the selected checkpoint's rows (the last state's when none was chosen)."""
    chosen = record.selected or {}
    return {"checkpoint": SELECTED, "selected_step": chosen.get("step", int(steps_trained)),
            "selected_loss": chosen.get("loss")}
