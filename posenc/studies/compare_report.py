"""Tables of the compare study: ``table.md`` and ``aggregate.md`` (figures: :mod:`posenc.studies.compare_plots`).

Rows are grouped per task (per grid ``tasks`` entry, ``task_variant``, where
a grid trains one task in several variants, e.g. addition in two formats:
``## reversed (addition)``) by label (the run's ``variant`` if it has one,
else the position kind, marked ``+randomized``; ``@<eval variant>`` for the
rows of an evaluation variant; plus the norm placement / kind when they
vary in the task), and per eval length (per problem size where the labels
of a table reach one size at different lengths: index hints double the
tokens of a digit) aggregated over seeds: the mean
and the half-width of its 95% t-interval, ``t_{0.975, n-1} s / sqrt(n)``
(``s`` the sample standard deviation of the ``n`` seeds; one seed: no
interval).

Fit-then-extrapolate (``train.fit_accuracy`` > 0): a run that stopped
without reaching the target (``fitted`` False) is left out of its cells by
default, so extrapolation is compared among runs that learned the task;
the cell says ``[k unfitted]`` (``include_unfitted=True`` keeps them in,
still counted). Fixed-budget runs (``fitted`` None) are all used. Cells
that are not applicable (e.g. a learned table past its rows) print
``n/a``, runs that diverged ``diverged`` (or ``[k diverged]`` after the
mean of the other seeds), cells whose every run did not fit ``not
fitted (k)``.

A decoded accuracy estimated from a sample of the rows with an error
(``eval.decode_rows``, :mod:`posenc.training.decode_sample`) says so in its
cell: ``[sampled k/F rows +-h]``, ``h`` the 95% half-width of the sampling
error of the cell's mean (:func:`posenc.studies.tables.sampled`).

Main metric: accuracy (exact match alongside); for ``text`` the
log-perplexity (loss, nats per token) over all tokens and over the last L
(training length) tokens of each window, perplexity alongside, under a
line naming the corpus (path, each file's SHA-256 as ``sha256sum`` prints
it, the first 12 digits, and the digest of the corpus as used). Rows of an
evaluation sweep (``sweep``, e.g. passkey depth) get their own table per
task (metric vs sweep value per length) and stay out of the main table.

Aggregate (``aggregate.md``, the tables of Delétang et al. 2023 / Ruoss et
al. 2023): per task x label, each run's accuracy averaged over the
out-of-distribution lengths (eval length > training length), then mean
and 95% t-interval over seeds; tasks grouped by Chomsky-hierarchy level.
"""

from __future__ import annotations

import collections

import numpy as np

from posenc.studies import tables
from posenc.studies.stats import interval, t_quantile  # noqa: F401  (re-exported)
from posenc.training.selection import SELECTED

LEVEL_ORDER = ("R", "DCF", "CS", None)
LEVEL_NAMES = {"R": "regular", "DCF": "deterministic context-free", "CS": "context-sensitive"}
METRICS = ("loss", "accuracy", "exact_match", "decoded_accuracy", "decoded_exact_match", "perplexity",
           "loss_last_L", "perplexity_last_L")
# What each metric is, in the captions: which paper's score it is comparable to.
DESCRIBE = {
    "decoded_accuracy": "decoded accuracy (the answer generated greedily from BOS problem SEP, each answer "
                        "token scored: DeepMind's per-position accuracy, Delétang et al. / Ruoss et al.)",
    "decoded_exact_match": "decoded exact match (the whole generated answer right: Kazemnejad et al.)",
    "accuracy": "teacher-forced token accuracy (every earlier answer token given)",
    "exact_match": "teacher-forced exact match",
}


def table_key(row: dict) -> str:
    """The table a row belongs to: its grid ``tasks`` entry (``task_variant``), else its task."""
    return row.get("task_variant") or row["task"]


def _of_table(task: str, rows) -> list[dict]:
    return [r for r in rows if task in (r.get("task"), table_key(r))]


def main_metric(task: str, rows=()) -> str:
    """The score a task's (or a task variant's) tables lead with: log-perplexity for text, else the
    decoded accuracy (the teacher-forced accuracy for rows written without decoding)."""
    mine = _of_table(task, rows)
    if task == "text" or (mine and all(r.get("task") == "text" for r in mine)):
        return "loss"
    decoded = any(r.get("decoded_accuracy") is not None for r in mine)
    return "decoded_accuracy" if decoded else "accuracy"


def columns(rs, *, sizes: bool = False) -> tuple[str, set]:
    """``(field, training values)`` of a table's columns: ``eval_length``, or ``problem_size`` where
    every row has one exact size and one size is reached at different lengths (the labels' size
    laws differ, e.g. index hints), or with ``sizes`` wherever every row has one exact size;
    training values: the columns at a run's training length."""
    sized = rs and all(r.get("problem_size") is not None and r.get("problem_size_min", r["problem_size"])
                       == r.get("problem_size_max", r["problem_size"]) for r in rs)
    lengths = collections.defaultdict(set)
    for r in rs:
        if sized:
            lengths[r["problem_size"]].add(r["eval_length"])
    field = "problem_size" if sized and (sizes or any(len(v) > 1 for v in lengths.values())) else "eval_length"
    return field, {r[field] for r in rs if r["eval_length"] == r["train_length"]} if field == "problem_size" \
        else {r["train_length"] for r in rs}


def exact_of(metric: str) -> str:
    return "decoded_exact_match" if metric == "decoded_accuracy" else "exact_match"


# ---------------------------------------------------------------------- groups
def task_level(task: str, rows=()) -> str | None:
    """The task's Chomsky-hierarchy level: from the rows' task metadata, else the task registry."""
    for r in rows:
        if r.get("task") == task and isinstance(r.get("task_metadata"), dict) and "level" in r["task_metadata"]:
            return r["task_metadata"]["level"]
    from posenc import tasks

    try:
        return tasks.spec(task)["level"]
    except ValueError:  # a task of a plugin not loaded here
        return None


def _heading(task: str, rows) -> str:
    real = sorted({r["task"] for r in rows if table_key(r) == task and r["task"] != task})
    level = task_level(real[0] if real else task, rows)
    return (f"## {task}" + (f" ({', '.join(real)})" if real else "")
            + (f" [{level}: {LEVEL_NAMES.get(level, level)}]" if level else ""))


def _label(row: dict, vary: set[str]) -> str:
    if row.get("variant"):
        parts = [row["variant"]]
    else:
        parts = [row["position"] + ("+randomized" if row.get("randomized") else "")]
    if row.get("eval_variant"):
        parts[0] += f"@{row['eval_variant']}"
    if row.get("checkpoint") == SELECTED:  # the state chosen on validation loss (train.select_length)
        parts[0] += f" [{SELECTED}]"
    if "placement" in vary:
        parts.append(row["placement"])
    if "norm" in vary:
        parts.append(row["norm"])
    return "/".join(parts)


def _by_task(rows) -> dict:
    out = collections.defaultdict(list)
    for r in rows:
        out[table_key(r)].append(r)
    return out


def _vary(rs) -> set:
    return {f for f in ("placement", "norm") if len({r.get(f) for r in rs}) > 1}


def cell_stats(group: list[dict], *, include_unfitted: bool = False, only_unfitted: bool = False) -> dict:
    """``{metric: (mean, half_width, n) or None, "diverged": k, "unfitted": k, "runs": n}`` of one cell.

    The statistics are over the fitted runs (and those with no fit target),
    over every run with ``include_unfitted``, over the unfitted ones only
    with ``only_unfitted``.
    """
    unfitted = sum(r.get("fitted") is False for r in group)
    if only_unfitted:
        use = [r for r in group if r.get("fitted") is False]
    else:
        use = group if include_unfitted else [r for r in group if r.get("fitted") is not False]
    stats = {m: interval([r[m] for r in use if r.get(m) is not None]) for m in METRICS}
    stats.update(diverged=sum(r.get("diverged_at_step") is not None for r in group), unfitted=unfitted,
                 runs=len(group), sampled=tables.sampled(use))  # decoded accuracy from a sample of rows
    return stats


def summarize(rows: list[dict], *, include_unfitted: bool = False, only_unfitted: bool = False) -> dict:
    """``{task: {label: {eval_length: cell_stats}}}`` over seeds (rows of sweeps left out)."""
    opts = dict(include_unfitted=include_unfitted, only_unfitted=only_unfitted)
    out = {}
    for task, rs in _by_task(r for r in rows if not r.get("sweep")).items():
        vary, (column, _) = _vary(rs), columns(rs)
        cells = collections.defaultdict(lambda: collections.defaultdict(list))
        for r in rs:
            cells[_label(r, vary)][r[column]].append(r)
        out[task] = {label: {n: cell_stats(g, **opts) for n, g in sorted(by.items())}
                     for label, by in cells.items()}
    return out


def summarize_sweeps(rows: list[dict], *, include_unfitted: bool = False, only_unfitted: bool = False) -> dict:
    """``{task: {option: {label: {value: {eval_length: cell_stats}}}}}`` of the sweep rows."""
    opts = dict(include_unfitted=include_unfitted, only_unfitted=only_unfitted)
    out = {}
    for task, rs in _by_task(r for r in rows if r.get("sweep")).items():
        vary = _vary(rs)
        cells = collections.defaultdict(list)
        for r in rs:
            (option, value), = r["sweep"].items()
            cells[(option, _label(r, vary), value, r["eval_length"])].append(r)
        table = {}
        for (option, label, value, n), g in sorted(cells.items(), key=lambda kv: str(kv[0])):
            table.setdefault(option, {}).setdefault(label, {}).setdefault(value, {})[n] = cell_stats(g, **opts)
        for option in table:  # values in numeric order
            for label in table[option]:
                table[option][label] = dict(sorted(table[option][label].items()))
        out[task] = table
    return out


# ---------------------------------------------------------------------- tables


def _cell(stats: dict, metric: str, extra: tuple | None = None) -> str:
    main, diverged, unfitted = stats[metric], stats.get("diverged", 0), stats.get("unfitted", 0)
    if main is None:
        failed = ["diverged"] * bool(diverged) + [f"not fitted ({unfitted})"] * bool(unfitted)
        return " / ".join(failed) if failed else "n/a"
    text = tables.number(main, metric=metric)
    if extra is not None and stats.get(extra[0]) is not None:
        text += f" ({extra[1]} {stats[extra[0]][0]:.{extra[2]}f})"
    if metric == "decoded_accuracy" and stats.get("sampled"):
        k, failing, half = stats["sampled"]
        text += f" [sampled {k}/{failing} rows +-{half:.3f}]"
    if diverged:
        text += f" [{diverged} diverged]"
    if unfitted:
        text += f" [{unfitted} unfitted]"
    return text


def _caption(metric: str, seeds: int, train_lengths, *, fitting: bool, include_unfitted: bool,
             extra: str = "") -> str:
    text = (f"{metric}: {tables.INTERVAL_NOTE}; {seeds} seed(s) (t-interval: mean -+ t_0.975,n-1 s / sqrt(n))"
            f"{extra}; "
            f"* = training length {', '.join(map(str, sorted(train_lengths)))}")
    if fitting:
        text += ("; [k unfitted]: k runs stopped before reaching train.fit_accuracy, "
                 + ("included in the cell" if include_unfitted else "left out of the cell"))
    return text


def _grid(label_cells: dict, lengths, train_lengths, first: str, prefix: str = "") -> list[str]:
    header = [first] + [f"{prefix}{n}{'*' if n in train_lengths else ''}" for n in lengths]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for label, cells in label_cells.items():
        lines.append("| " + " | ".join([label] + [cells.get(n, "") for n in lengths]) + " |")
    return lines + [""]


def _task_tables(task: str, table: dict, sweeps: dict, rs: list[dict], include_unfitted: bool) -> list[str]:
    lengths = sorted({n for t in table.values() for n in t})
    column, marked = columns([r for r in rs if not r.get("sweep")])
    train_lengths = {r["train_length"] for r in rs}
    sized = dict(prefix="n=") if column == "problem_size" else {}
    seeds = len({r["seed"] for r in rs})
    fitting = any(r.get("fitted") is not None for r in rs)
    caption = dict(fitting=fitting, include_unfitted=include_unfitted)
    lines = [_heading(task, rs), ""]
    if task == "text":
        lines += _corpus_lines(rs)
        measures = [("loss", "perplexity", "over all tokens of each window")]
        if any(r.get("loss_last_L") is not None for r in rs):
            last = sorted({r["last_L"] for r in rs if r.get("last_L")})
            measures.append(("loss_last_L", "perplexity_last_L",
                             f"over the last L = {', '.join(map(str, last))} tokens of each window"))
        for loss, ppl, where in measures:
            lines += [_caption(f"log-perplexity (nats per token) {where}", seeds, train_lengths,
                               extra=", perplexity in brackets", **caption)
                      + "; non-overlapping windows of the held-out split", ""]
            lines += _grid({label: {n: _cell(s, loss, (ppl, "ppl", 2)) for n, s in table[label].items()}
                            for label in sorted(table)}, lengths, train_lengths, "encoding")
        return lines
    metric = main_metric(task, rs)
    shown = [metric] + (["accuracy"] if metric == "decoded_accuracy" else [])  # the teacher-forced one too
    for m in shown if table else ():
        if m != metric:
            lines += [f"### {task}: teacher-forced, for comparison", ""]
        lines += [_caption(DESCRIBE.get(m, m), seeds, train_lengths, extra=", exact match (EM) in brackets",
                           **caption) + ("; columns: problem sizes n (the labels' token lengths differ), "
                                         "* = the training size" if sized else "")
                  + (f"; {tables.SAMPLED_NOTE}" if m == "decoded_accuracy" and tables.sampled(rs) else ""), ""]
        lines += _grid({label: {n: _cell(s, m, (exact_of(m), "EM", 2)) for n, s in table[label].items()}
                        for label in sorted(table)}, lengths, marked, "encoding", **sized)
    for option, by_label in sweeps.items():
        sweep_lengths = sorted({n for v in by_label.values() for c in v.values() for n in c})
        lines += [f"### {task}: {metric} vs {option} (evaluation sweep), per evaluation length", ""]
        lines += _grid({f"{label} {option}={value}": {n: _cell(s, metric, (exact_of(metric), "EM", 2))
                                                      for n, s in cells.items()}
                        for label, values in sorted(by_label.items()) for value, cells in values.items()},
                       sweep_lengths, train_lengths, f"encoding {option}")
    return lines


def _corpus_lines(rs) -> list[str]:
    """A paragraph "Corpus: ..." per corpus the text rows ``rs`` trained on (its path and SHA-256s:
    :func:`posenc.tasks.corpus.describe`); none for rows without the corpus in their task metadata."""
    from posenc.tasks import corpus

    said = dict.fromkeys(corpus.describe(r["task_metadata"]) for r in rs
                         if isinstance(r.get("task_metadata"), dict) and "sha256" in r["task_metadata"])
    return [text for line in said for text in (f"Corpus: {line}", "")]


def table_markdown(rows: list[dict], *, include_unfitted: bool = False) -> str:
    """Markdown: per task (level in the heading), rows = label, columns = eval lengths (train length *)."""
    summary = summarize(rows, include_unfitted=include_unfitted)
    sweeps = summarize_sweeps(rows, include_unfitted=include_unfitted)
    by_task = _by_task(rows)
    lines = []
    if any(r.get("checkpoint") == SELECTED for r in rows):
        lines += [f"[{SELECTED}]: the parameters of lowest validation loss at the length train.select_length "
                  "among the evaluations during training (Cho et al. 2024's checkpoint choice); labels without "
                  "it: the last parameters (rows checkpoint last).", ""]
    for task in sorted(set(summary) | set(sweeps)):
        lines += _task_tables(task, summary.get(task, {}), sweeps.get(task, {}), by_task[task], include_unfitted)
    return "\n".join(lines)


# ------------------------------------------------------------------- aggregate
def _sizes_in(row) -> int:
    """How many problem sizes a row's evaluation bin holds (1 for exact sizes and older rows)."""
    lo, hi = row.get("problem_size_min"), row.get("problem_size_max")
    return int(hi) - int(lo) + 1 if lo is not None and hi is not None else 1


def aggregate(rows: list[dict], *, include_unfitted: bool = False) -> dict:
    """``{task: {label: cell}}``: accuracy over the out-of-distribution lengths, mean over seeds.

    Each run's score is its mean accuracy over eval lengths > its training
    length, each length weighted by the number of problem sizes its bin holds
    (so bins give the mean over every test size, as Delétang et al.; lengths
    with no value, e.g. n/a, are skipped); a cell has
    ``stat`` ((mean, half_width, n) or None), ``unfitted``, ``diverged``,
    ``lengths`` (the most OOD lengths a run's score averages),
    ``ood_lengths`` (how many there are) and ``sampled`` (a decoded accuracy
    in it estimated from a sample of rows). Tasks whose main metric is not
    accuracy (text) and sweep rows are left out.
    """
    out = {}
    for task, rs in _by_task(r for r in rows if not r.get("sweep")).items():
        metric = main_metric(task, rs)
        if metric == "loss":
            continue
        vary = _vary(rs)
        runs = collections.defaultdict(lambda: collections.defaultdict(list))
        for r in rs:
            runs[_label(r, vary)][(r.get("config_hash"), r.get("run"), r["seed"])].append(r)
        table = {}
        for label, by_run in runs.items():
            ood = sorted({r["eval_length"] for g in by_run.values() for r in g if r["eval_length"] > r["train_length"]})
            if not ood:
                continue
            scores, unfitted, diverged, used = [], 0, 0, 0
            for group in by_run.values():
                failed_fit = any(r.get("fitted") is False for r in group)
                unfitted += failed_fit
                diverged += any(r.get("diverged_at_step") is not None for r in group)
                values = [(r[metric], _sizes_in(r)) for r in group
                          if r["eval_length"] > r["train_length"] and r.get(metric) is not None]
                if values and (include_unfitted or not failed_fit):
                    # a length's score counts once per problem size its bin holds: the mean over sizes
                    scores.append(float(np.average([v for v, _ in values], weights=[w for _, w in values])))
                    used = max(used, len(values))
            beyond = [r for g in by_run.values() for r in g if r["eval_length"] > r["train_length"]]
            table[label] = dict(stat=interval(scores), unfitted=unfitted, diverged=diverged, lengths=used,
                                ood_lengths=len(ood), metric=metric,  # sampled: a decoded accuracy estimated
                                sampled=metric == "decoded_accuracy" and tables.sampled(beyond) is not None)
        if table:
            out[task] = table
    return out


def _level_key(task: str, rows) -> tuple:
    level = task_level(task, rows)
    return (LEVEL_ORDER.index(level) if level in LEVEL_ORDER else len(LEVEL_ORDER), task)


def ordered_tasks(tasks, rows=()) -> list[str]:
    """Tasks grouped by level (R, DCF, CS, then none), by name within a level."""
    return sorted(tasks, key=lambda t: _level_key(t, rows))


def _aggregate_cell(cell: dict | None) -> str:
    if cell is None:
        return ""
    stat, notes = cell["stat"], []
    text = "n/a" if stat is None else tables.number(stat, metric="accuracy")
    if stat is None and cell["diverged"]:
        text = "diverged"
    elif stat is None and cell["unfitted"]:
        text = f"not fitted ({cell['unfitted']})"
    if stat is not None and cell["lengths"] < cell["ood_lengths"]:
        notes.append(f"{cell['lengths']}/{cell['ood_lengths']} lengths")
    if stat is not None and cell["diverged"]:
        notes.append(f"{cell['diverged']} diverged")
    if stat is not None and cell["unfitted"]:
        notes.append(f"{cell['unfitted']} unfitted")
    if stat is not None and cell.get("sampled"):
        notes.append("sampled")
    return text + "".join(f" [{n}]" for n in notes)


def aggregate_markdown(rows: list[dict], *, include_unfitted: bool = False) -> str:
    """The aggregate table: tasks (grouped by level) x labels, plus the mean over tasks per label."""
    agg = aggregate(rows, include_unfitted=include_unfitted)
    if not agg:
        return ""
    labels = sorted({label for t in agg.values() for label in t})
    fitting = any(r.get("fitted") is not None for r in rows)
    lines = ["## Aggregate: accuracy over the out-of-distribution lengths", "",
             "Per task x encoding: each run's accuracy (decoded where the rows have it, else teacher-forced) "
             "averaged over the evaluation lengths longer than "
             f"its training length, then over seeds: {tables.INTERVAL_NOTE}; [k/m lengths]: only k of the m "
             "longer lengths have a value (n/a ones are skipped)"
             + ("; [k unfitted]: k runs did not reach train.fit_accuracy, "
                + ("included" if include_unfitted else "left out") if fitting else "")
             + ("; [sampled]: decoded accuracies estimated from a sample of the rows with an error "
                "(eval.decode_rows; table.md gives each one's sampling error)"
                if any(c.get("sampled") for t in agg.values() for c in t.values()) else "") + ".", "",
             "| level | task | " + " | ".join(labels) + " |", "|" + "---|" * (len(labels) + 2)]
    for task in ordered_tasks(agg, rows):
        level = task_level(task, rows) or ""
        lines.append(f"| {level} | {task} | " + " | ".join(_aggregate_cell(agg[task].get(label))
                                                          for label in labels) + " |")
    means = []
    for label in labels:
        vals = [agg[t][label]["stat"][0] for t in agg if label in agg[t] and agg[t][label]["stat"]]
        text = f"{np.mean(vals):.3f}" if vals else ""
        with_label = sum(label in agg[t] for t in agg)
        if vals and len(vals) < len(agg):
            text += f" [{len(vals)}/{len(agg)} tasks]"
        means.append(text if with_label else "")
    lines += ["| | **mean over tasks** | " + " | ".join(means) + " |", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------- files
def write_table(rows: list[dict], path: str, *, include_unfitted: bool = False) -> None:
    tables.write(path, table_markdown(rows, include_unfitted=include_unfitted))


def write_aggregate(rows: list[dict], path: str, *, include_unfitted: bool = False) -> bool:
    """Write ``aggregate.md`` (atomically); False (nothing written) when no task has OOD accuracy."""
    text = aggregate_markdown(rows, include_unfitted=include_unfitted)
    if text:
        tables.write(path, text)
    return bool(text)
