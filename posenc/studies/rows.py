"""The rows of every study, field by field: what :func:`posenc.studies.load_rows` returns.

A row is a plain dict (JSON: null for a missing or not applicable value).
Every study's rows carry ``point`` (the point that wrote them); a run's
rows (``compare``, the runs inside ``extend``) carry the fields of
:data:`RUN_FIELDS`; each study adds its own (``Study.row_fields``:
:func:`study_fields`). Timings and paths (:data:`VOLATILE`) say when and
where a row was made, not what it measured: two runs of one config differ
there and nowhere else (:func:`without_volatile`).

    import pandas as pd
    from posenc import studies
    df = pd.DataFrame(studies.load_rows("/tmp/compare"))
    df.groupby(["variant", "eval_length"])["accuracy"].mean()
"""

from __future__ import annotations

RUN_FIELDS = {
    # identity
    "point": "the study point that wrote the row (its directory runs/<point>/)",
    "name": "the run's name",
    "task": "task.name",
    "task_metadata": "the task's facts (options, level, vocabulary, size law; text: the corpus, "
                     ":data:`TEXT_CORPUS_FIELDS`)",
    "position": "model.position.kind",
    "position_options": "the validated options of every encoding in use",
    "layer_kinds": "the encoding of each layer",
    "randomized": "randomized positions (Ruoss et al. 2023)",
    "norm": "model.norm.kind", "placement": "model.norm.placement", "qk_norm": "model.norm.qk_norm",
    "seed": "train.seed", "train_length": "task.train_length", "steps": "train.steps",
    "config_hash": "sha256 of the canonical run config (bookkeeping fields left out)",
    "jax_version": "jax.__version__", "posenc_version": "posenc.__version__",
    # training
    "steps_trained": "steps actually trained (fewer with fit_accuracy)",
    "fitted": "reached train.fit_accuracy (null: a fixed budget)",
    "steps_to_fit": "the step it fitted at", "fit_accuracy": "validation accuracy at the last fit check",
    "fit_examples": "the fit check's examples: \"validation\", a stream apart from the reported ones "
                    "(null: no fit check)",
    "train_loss": "last logged training loss", "train_accuracy": "last logged training accuracy",
    "seeds_trained_together": "seeds vmapped in one step with this one",
    "diverged_at_step": "training stopped on a NaN / Inf here (metrics null)",
    "dataset_size": "train.dataset_size: the fixed training set's examples (absent: a fresh batch every step)",
    "train_examples": "examples trained on (a fixed set: the visits over its epochs)",
    "checkpoint": "last | best_long_val: the parameters scored (train.select_length; absent: the last)",
    "selected_step": "best_long_val rows: the step whose validation loss at train.select_length was lowest",
    "selected_loss": "best_long_val rows: that validation loss",
    # evaluation
    "eval_length": "evaluation length (tokens)", "eval_variant": "the evaluation variant (null: as trained)",
    "sweep": "the evaluation sweep point, e.g. {'depth': 0.5}",
    "loss": "mean cross-entropy over the scored tokens (nats)",
    "accuracy": "token accuracy over the answer tokens (teacher-forced)",
    "exact_match": "fraction of examples with every answer token right (teacher-forced)",
    "eval_tokens": "scored tokens (text: eval.tokens, or the count eval.tokens=auto chose: the same at every "
                   "length)", "eval_rows_per_step": "rows per evaluation forward (memory bound)",
    "decoded_accuracy": "answer-token accuracy of the greedy generated answer (eval.decode; null: off)",
    "decoded_exact_match": "fraction of examples whose generated answer is entirely right (eval.decode)",
    "failing_rows": "examples with a wrong answer token under teacher forcing along what decoding reads: the rows "
                    "that need decoding (the others are right decoded)",
    "decoded_rows": "of them decoded (eval.decode_rows: all, or a seeded sample); fewer than failing_rows: "
                    "decoded_accuracy is estimated from the sample, decoded_exact_match stays exact",
    "decoded_accuracy_se": "standard error of decoded_accuracy from sampling the failing rows (0: all decoded; "
                           "posenc.training.decode_sample)",
    "problem_size": "the evaluation problem size (synthetic tasks; the bin's largest)",
    "problem_size_min": "the smallest problem size evaluated at this length (eval.sizes)",
    "problem_size_max": "the largest problem size evaluated at this length",
    "eval_windows": "text: held-out windows scored",
    "text_protocol": "text: nonoverlapping or sliding windows (eval.text_protocol)",
    "eval_stride": "text: tokens between window starts",
    "perplexity": "text: exp(loss)", "last_L": "text: the last positions of each window scored apart",
    "loss_last_L": "text: loss over the last L positions", "perplexity_last_L": "exp(loss_last_L)",
    "position_loss": "text: loss over equal position ranges of the window",
    "not_applicable": "why the metrics are null (e.g. past a learned table's rows)",
    # fine-tuning (extend)
    "base_run": "the base run's directory", "base_hash": "the base run's config hash",
    "finetune_steps": "fine-tuning steps (0: zero-shot)", "finetune_tokens": "fine-tuning tokens",
    # timings
    "train_seconds": "training wall time", "eval_seconds": "evaluation wall time",
    "wall_time": "train_seconds + eval_seconds", "finished_at": "local time the run finished",
}

# The corpus facts in a text row's task_metadata (posenc.tasks.corpus, Corpus.metadata).
TEXT_CORPUS_FIELDS = {
    "corpus": "python-stdlib-source (default) | files (task.options.path) | token-memmap (task.options.tokens)",
    "sha256": "SHA-256 of the corpus as used: every file's bytes read plus a NUL separator, in corpus order, "
              "after max_bytes (memmaps: the .bin files' bytes, train then val); not what sha256sum of a file "
              "prints (files[].sha256 is)",
    "files": "your files and memmaps (not the stdlib): one {path, sha256, bytes, used_bytes, split} per file read, "
             "in corpus order",
    "files[].path": "relative to path / tokens for a directory; the file's name for a single file",
    "files[].sha256": "SHA-256 of the whole file on disk: what sha256sum prints, whatever max_bytes kept",
    "files[].bytes": "the file's size on disk",
    "files[].used_bytes": "its bytes in the corpus (fewer: cut by max_bytes)",
    "files[].split": "train | eval | train+eval (a single file or .bin split at its tail)",
    "path": "the file or directory read (absolute)", "tokens": "the .bin file or directory (absolute)",
    "stdlib_root": "the stdlib directory read", "python_version": "the Python whose stdlib it is",
    "split_rule": "file (by a hash of each path) | tail (the last eval_fraction) | files (train.bin / val.bin)",
    "num_files": "files read", "train_files": "of them in train", "eval_files": "of them in eval",
    "skipped_files": "binary files of the directory left out",
    "num_bytes": "bytes as used", "train_bytes": "of them in train", "eval_bytes": "of them in eval",
    "num_tokens": "memmap tokens", "train_tokens": "of them in train", "eval_tokens": "of them in eval",
    "eval_fraction": "task.options.eval_fraction", "max_bytes": "task.options.max_bytes (null: the whole files)",
    "separator": "the byte after each file (hex)", "dtype": "the memmap's token type", "max_token": "its largest id",
    "python_implementation": "CPython, PyPy, ...",
}

VOLATILE = ("train_seconds", "eval_seconds", "wall_time", "finished_at", "base_run")


def study_fields(name: str) -> dict[str, str]:
    """The fields study ``name`` adds to its rows, with their docs."""
    from posenc import studies

    return dict(studies.study(name).row_fields)


def without_volatile(rows, fields=VOLATILE) -> list[dict]:
    """``rows`` without timings and paths: what two runs of one config share exactly."""
    return [{k: v for k, v in r.items() if k not in fields} for r in rows]
