"""Length evaluation: loss, accuracy and exact match at every ``config.eval.lengths``.

For each length, ``eval.num_batches`` batches of ``split="eval"`` data (every
example at the largest problem size that fits) drawn from keys
``fold_in(fold_in(key(eval.seed), length), i)`` (text: consecutive held-out
windows, below): the same evaluation set for every run, independent of
training. Each length is one static shape, so it
compiles once per process (the model switches to blocked attention for long
sequences by itself), and runs as one compiled call: every batch and row
chunk inside one loop (``eval_step.eval_length_fn``), so a length costs one
dispatch. The program is shared by every model of the graph: the seeds of a
grid cell, the fit checks and the final evaluation at the training length.
:func:`evaluate_seeds` evaluates S models of one graph (a cell's seeds) in
one ``jax.vmap``-ed call per length. An evaluation variant is a graph of its
own (encoding options are static), so it compiles its own programs. Models with randomized positions are evaluated with
randomized positions as well (Ruoss et al. 2023), seeded the same way.

Memory is bounded by a token budget: a batch runs in row chunks of at most
``eval.max_tokens_per_step`` tokens (0 = the whole batch at once), which
gives the same sums as one batch (the chunks are rows of the same
generated batch).

Not applicable (metrics ``None`` and a ``not_applicable`` reason): a length
past what an encoding can represent (e.g. a learned table's rows), and
randomized positions at lengths above ``randomized_max_position``.

Evaluation variants (``eval.variants``, e.g. ``{"yarn4":
{"model.position.rope.scaling": "yarn", "model.position.rope.factor":
4.0}}``): the trained parameters evaluated in a model whose ``model.*``
fields are overridden (zero-shot context extension); rows carry
``eval_variant``. The position kinds cannot change.

With a ``mesh`` (several devices) each chunk is split over its devices; the
sums are the same as on one device up to float32 rounding.

Language modelling (``text``, Press et al. 2022): the evaluation set at
length ``N`` is the held-out split's consecutive non-overlapping windows
from its first token (``Text.sequential_batch``: window ``w`` predicts
tokens ``w N + 1 .. (w + 1) N``), as many as ``eval.num_batches *
eval.batch_size`` (fewer if the split holds fewer; ``eval_windows`` says how
many). A row carries ``loss`` and ``perplexity = exp(loss)`` over all
tokens, ``loss_last_L`` and ``perplexity_last_L`` over the last ``last_L =
min(task.train_length, N)`` positions of each window (every prediction
there has at least ``N - L`` tokens of context), and ``position_loss``: mean
loss over ``eval.position_buckets`` equal position ranges ``[b N / n, (b +
1) N / n)`` (the loss-vs-position curve).

Evaluation sweeps: a task that declares ``eval_sweep`` (passkey depth,
flip-flop ``p_ignore``) is also evaluated at every sweep point, at every
length and for every evaluation variant, through a config whose
``task.options`` holds the point's value (its own compiled step); those
rows carry ``sweep`` (e.g. ``{"depth": 0.5}``) and come after the rows of
the task as configured, which are exactly those of a task without a sweep.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from posenc.model import Decoder, registry
from posenc.training import decode as decode_lib
from posenc.training import eval_step as eval_lib
from posenc.training import prepare, specs
from posenc.training import sharding as sharding_lib


def not_applicable(config, spec, length: int) -> str | None:
    """Why evaluation at ``length`` is impossible for this model, or None."""
    pos = spec.position
    for kind in pos.kinds:
        limit = registry.get(kind).longest_sequence(pos.options[kind])
        if limit is not None and length > limit:
            return f"{kind} encodes {limit} positions (e.g. learned table rows) < eval length {length}"
    if pos.randomized and length > pos.randomized_max_position:
        return (f"randomized positions are drawn from [0, {pos.randomized_max_position}), "
                f"fewer than eval length {length}")
    return None


def _buckets(position_loss, position_mask, num_buckets: int) -> list[dict]:
    length = len(position_loss)
    edges = np.linspace(0, length, num_buckets + 1).round().astype(int)
    out = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        if hi <= lo:
            continue
        m = float(position_mask[lo:hi].sum())
        out.append({"start": int(lo), "end": int(hi),
                    "loss": float(position_loss[lo:hi].sum() / m) if m > 0 else None})
    return out


def _last_l(totals, length: int, last: int) -> dict:
    """Loss and perplexity over the last ``last`` positions of every window (from the per-position sums)."""
    loss = np.asarray(totals["position_loss"])[length - last:].sum()
    mask = np.asarray(totals["position_mask"])[length - last:].sum()
    value = float(loss / mask) if mask > 0 else None
    return {"last_L": int(last), "loss_last_L": value,
            "perplexity_last_L": None if value is None else float(np.exp(value))}


def _not_applicable_row(length: int, reason: str) -> dict:
    return {"eval_length": int(length), "loss": None, "accuracy": None, "exact_match": None,
            "not_applicable": reason}


VALIDATION = 0x7A11D  # folded into the evaluation keys of the fit check: other examples than the reported ones
DEFAULT_TOKENS = "auto"  # eval.tokens of a config without the field (posenc.tasks.text.Text.eval_tokens)


@dataclasses.dataclass(frozen=True)
class Plan:
    """How one length is evaluated: batches, row chunks, the size bin or the scored windows."""

    batch_size: int
    rows: int
    num_batches: int
    per_position: bool
    sequential: bool
    min_size: int | None = None  # synthetic tasks: the bin's smallest problem size
    max_size: int | None = None
    windows: tuple | None = None  # text: (scored windows, stride or None)


def plan_length(task, config, length: int, devices: int = 1) -> Plan:
    """The :class:`Plan` of evaluating ``task`` at ``length`` under ``config.eval``.

    Text (Press et al. 2022): the first ``eval.tokens`` targets of the held-out split ("auto":
    the most that are whole windows at every length, up to 2**17), the same at every length,
    in non-overlapping windows or (``eval.text_protocol="sliding"``) windows every
    ``eval.stride`` tokens. Synthetic tasks: ``eval.num_batches`` batches with sizes
    from :func:`posenc.tasks.base.eval_bins` (``eval.sizes``).
    """
    from posenc.tasks import base

    ev = config.eval
    per_position = config.task.name == "text"
    sequential = hasattr(task, "sequential_batch")
    batch_size = int(ev.batch_size)
    rows = eval_lib.rows_per_step(batch_size, int(length), int(ev.get("max_tokens_per_step", 0)), devices)
    if sequential:
        stride = int(ev.get("stride", 0)) if ev.get("text_protocol", "nonoverlapping") == "sliding" else None
        # the same count at every length: eval.tokens, or what "auto" chooses for all of eval.lengths
        lengths = {int(n) for n in ev.lengths} | {int(length)}
        tokens = task.eval_tokens(ev.get("tokens", DEFAULT_TOKENS), lengths, stride)
        count = task.scored_windows(tokens, int(length), stride)
        return Plan(batch_size, rows, -(-count // batch_size), per_position, True, windows=(count, stride))
    lengths = sorted({int(n) for n in ev.lengths} | {int(length)})
    lo, hi = base.eval_bins(task, lengths, mode=ev.get("sizes", "default"))[int(length)]
    return Plan(batch_size, rows, int(ev.num_batches), per_position, False, min_size=lo, max_size=hi)


def _row(totals, config, length: int, plan: Plan) -> dict:
    """The row of one model's summed statistics (host arrays) at ``length``."""
    denom = max(float(totals["mask_sum"]), 1.0)
    row = {
        "eval_length": int(length),
        "loss": float(totals["loss_sum"]) / denom,
        "accuracy": float(totals["correct_sum"]) / denom,
        "exact_match": float(totals["exact_sum"]) / max(float(totals["examples"]), 1.0),
        "eval_tokens": int(totals["mask_sum"]),
        "eval_rows_per_step": plan.rows,
    }
    if plan.sequential:
        count, stride = plan.windows
        row.update(eval_windows=count, text_protocol="sliding" if stride else "nonoverlapping",
                   eval_stride=stride or int(length))
    else:
        row.update(problem_size=plan.max_size, problem_size_min=plan.min_size, problem_size_max=plan.max_size)
    if plan.per_position:
        row["perplexity"] = float(np.exp(row["loss"]))
        row.update(_last_l(totals, int(length), min(int(config.task.train_length), int(length))))
        row["position_loss"] = _buckets(np.asarray(totals["position_loss"]),
                                        np.asarray(totals["position_mask"]),
                                        int(config.eval.position_buckets))
    return row


def _decodes(config, plan: Plan) -> bool:
    """Whether the length is also scored decoded (decoded_accuracy, decoded_exact_match: the answers
    generated greedily through the cache, from each row's first teacher-forced error)."""
    return not plan.sequential and config.eval.get("decode", True)


def _root(config, length: int, stream: str = "eval"):
    root = jax.random.fold_in(jax.random.key(int(config.eval.seed)), int(length))
    return jax.random.fold_in(root, VALIDATION) if stream == "validation" else root


def _length_fn(task, config, length: int, *, mesh=None, seeds: bool = False, decoded: bool = True):
    """``(fn, plan, decodes)``: the compiled program of ``length``, its :class:`Plan`, and whether it decodes."""
    plan = plan_length(task, config, length, 1 if mesh is None else mesh.size)
    decodes = decoded and mesh is None and _decodes(config, plan)
    fn = eval_lib.eval_length_fn(task, specs.Positions.from_config(config), int(length), plan.batch_size,
                                 plan.num_batches, rows=plan.rows, per_position=plan.per_position,
                                 sequential=plan.sequential, mesh=mesh, seeds=seeds, min_size=plan.min_size,
                                 windows=plan.windows, errors=decodes)
    return fn, plan, decodes


def length_fn(task, config, length: int, **kw):
    """The compiled evaluation program of ``length`` (``eval_step.eval_length_fn``'s, as evaluation runs it)."""
    return _length_fn(task, config, length, **kw)[0]


def evaluate_length(model, task, config, spec, length: int, *, mesh=None, stream: str = "eval",
                    decoded: bool = True) -> dict:
    """Metrics of ``model`` on ``task`` at ``length``: loss, accuracy, exact_match (teacher-forced),
    decoded_accuracy and decoded_exact_match (greedy through the cache), the text measures.

    Every batch and row chunk runs in one compiled call (``eval_step.eval_length_fn``).
    ``stream="validation"`` draws other examples than the reported ones (the fit check).
    """
    reason = not_applicable(config, spec, length)
    if reason is not None:
        return _not_applicable_row(length, reason)
    fn, plan, decodes = _length_fn(task, config, length, mesh=mesh, decoded=decoded)
    graphdef, state = nnx.split(model)
    root = placed = _root(config, length, stream)
    if mesh is not None:  # a no-op for arrays already placed; places fresh ones (variant models)
        state = sharding_lib.shard_state(state, mesh, fsdp=sharding_lib.fsdp_enabled(config))
        placed = sharding_lib.replicate(root, mesh)
    totals = jax.device_get(fn(graphdef, state, placed))
    row = _row(totals, config, length, plan)
    if decodes:
        answers = decode_lib.eval_answers(model, task, config, int(length), root=root, min_size=plan.min_size,
                                          first_errors=totals["first_error"])
        row.update(answers.metrics())
    return row


def split_params(models):
    """``(graphdef, params, rest)`` of models of one graph: their ``nnx.Param`` states stacked [S].

    ``rest`` (RNG streams) is the first model's: the deterministic forward never draws from it.
    """
    parts = [nnx.split(m, nnx.Param, ...) for m in models]
    params = jax.tree.map(lambda *xs: jnp.stack(xs), *[p for _, p, _ in parts])
    return parts[0][0], params, parts[0][2]


def evaluate_length_seeds(graphdef, params, rest, task, config, spec, length: int, *, stream: str = "eval",
                          decoded: bool = True) -> list[dict]:
    """:func:`evaluate_length` of S models at once: ``params`` stacked [S] (:func:`split_params`).

    One compiled, ``jax.vmap``-ed call (one device), and the answers decoded for the S models
    together (``decode.eval_answers_seeds``); returns one row per model, each equal to
    its own :func:`evaluate_length` up to float32 rounding (batched matmuls).
    """
    size = jax.tree.leaves(params)[0].shape[0]
    reason = not_applicable(config, spec, length)
    if reason is not None:
        return [_not_applicable_row(length, reason) for _ in range(size)]
    fn, plan, decodes = _length_fn(task, config, length, seeds=True, decoded=decoded)
    root = _root(config, length, stream)
    totals = jax.device_get(fn(graphdef, params, rest, root))
    first = totals.pop("first_error", None)
    answers = decode_lib.eval_answers_seeds(graphdef, params, rest, task, config, int(length), root=root,
                                            min_size=plan.min_size, first_errors=first) if decodes else None
    out = []
    for j in range(size):
        row = _row(jax.tree.map(lambda x: x[j], totals), config, length, plan)
        if answers:
            row.update(answers[j].metrics())
        out.append(row)
    return out


def sweep_points(config, task) -> list:
    """``[(sweep, config, task)]`` of every point of ``task.eval_sweep``; ``sweep = {option: value}``.

    Each point's config holds the value in ``task.options``, so its
    evaluation step is compiled (and cached) for that point.
    """
    points = []
    for option, value, point in task.sweep():
        c = prepare.plain_copy(config)
        c.task.options[option] = value
        points.append(({option: value}, c, point))
    return points


def variant_model(model, spec):
    """A model built from ``spec`` holding ``model``'s trained parameters."""
    other = Decoder(spec, rngs=nnx.Rngs(0))
    nnx.update(other, nnx.state(model, nnx.Param))
    return other


def _plan(resolved, lengths):
    """``[(eval_variant, sweep, config, task, spec, length)]``: every row :func:`evaluate` gives, in order."""
    config, task = resolved.config, resolved.task
    lengths = tuple(config.eval.lengths) if lengths is None else tuple(lengths)
    variants = [(None, config, resolved.spec)] + [(n, c, s) for n, (c, s) in resolved.eval_variants.items()]
    plan = [(name, None, vconfig, task, vspec, int(n)) for name, vconfig, vspec in variants for n in lengths]
    for name, vconfig, vspec in variants:
        for sweep, pconfig, ptask in sweep_points(vconfig, task):
            plan += [(name, sweep, pconfig, ptask, vspec, int(n)) for n in lengths]
    return plan


def _labelled(row, name, sweep):
    return dict(row, eval_variant=name) if sweep is None else dict(row, eval_variant=name, sweep=sweep)


def evaluate_seeds(models, resolved, lengths=None) -> list[list[dict]]:
    """:func:`evaluate` of S models of one graph (a grid cell's seeds), all of them in each call.

    ``resolved``: the seeds' common config (they differ only in ``train.seed``,
    which evaluation does not read). Returns each model's rows, in
    :func:`evaluate`'s order; one device.
    """
    graphdef, params, rest = split_params(models)
    parts = {None: (graphdef, params, rest)}
    tree = jax.tree.structure(nnx.state(models[0], nnx.Param))
    for name, (_, vspec) in resolved.eval_variants.items():
        g, own, r = nnx.split(Decoder(vspec, rngs=nnx.Rngs(0)), nnx.Param, ...)
        # the variant takes the trained parameters as they are (variant_model), unless it has others
        parts[name] = ((g, params, r) if jax.tree.structure(own) == tree
                       else split_params([variant_model(m, vspec) for m in models]))
    out = [[] for _ in models]
    for name, sweep, config, task, spec, n in _plan(resolved, lengths):
        g, p, r = parts[name]
        for rows, row in zip(out, evaluate_length_seeds(g, p, r, task, config, spec, n)):
            rows.append(_labelled(row, name, sweep))
    return out


def evaluate(model, resolved, lengths=None, *, mesh=None) -> list[dict]:
    """:func:`evaluate_length` at each length, for the model and each evaluation variant (+ sweeps).

    ``resolved``: the run's :class:`~posenc.training.prepare.Resolved`. Rows of a
    variant carry ``eval_variant`` (None for the model as trained); rows of
    a sweep point carry ``sweep`` (module docstring).
    """
    models = {None: model}
    models.update((n, variant_model(model, s)) for n, (_, s) in resolved.eval_variants.items())
    return [_labelled(evaluate_length(models[name], task, config, spec, n, mesh=mesh), name, sweep)
            for name, sweep, config, task, spec, n in _plan(resolved, lengths)]
