"""Greedy decoding with the KV cache: answers as a user would read them off the model.

    tokens = decode.greedy(model, prompts, answer_length)       # prompts [B, P]: BOS problem SEP
    correct, mask = decode.answer_correctness(model, batch)     # per example, per position [B, L]
    correct, mask = decode.eval_correctness(model, task, config, length)  # the eval set at length
    [(correct, mask), ...] = decode.eval_correctness_seeds(graphdef, params, rest, task, config, length)
    decode.decoded_metrics(correct, mask)  # {"decoded_accuracy": ..., "decoded_exact_match": ...}
    answers = decode.eval_answers(model, task, config, length)  # eval.decode_rows failing rows decoded
    answers.metrics()  # the decoded metrics (accuracy estimated from the sample), the sample's size

:func:`greedy` prefills the cache with the prompts (one ``Decoder.decode``
call over ``P`` tokens), takes the argmax of the last logits, then feeds
each generated token back with ``Decoder.decode`` inside a ``lax.fori_loop``
(one compiled program per prompt length and answer length; no Python per
token). Token ``j`` of the answer is at position ``P + j`` (or
``positions[..., P + j]``).

:func:`answer_correctness` decodes the answers of a task batch (the layout of
:mod:`posenc.tasks.base`: ``targets[:, t]`` follows ``inputs[:, t]``, ``mask``
marks answer targets): the prompt is every token before the first answer
token, and from there each input token is the model's own prediction where
it is an answer token and the given token elsewhere (the queries of recall,
EOS after an answer), so answers of any layout are decoded as a user would
read them off the model. An answer token is right when its prediction
equals the target; the exact match of an example needs all of its answer
tokens right.

An evaluation set (:func:`eval_correctness`; the same for one batch) is
decoded by :mod:`posenc.training.decode_set`: rows right under teacher
forcing are right decoded and are not decoded, the others from their first
error on, in groups, in compiled segments (:mod:`posenc.training.decode_steps`;
its :class:`Schedule` sets the pacing). :func:`eval_answers` decodes
``eval.decode_rows`` of the failing rows of a length (a seeded sample,
:mod:`posenc.training.decode_sample`): every example keeps its exact decoded
exact match and first error, and the decoded accuracy is estimated, without
bias, from the sample.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from posenc.training import decode_sample, specs
from posenc.training import eval_step as eval_lib
from posenc.training.decode_set import _forced_seeds, _make_set, _run, _single, answer_span
from posenc.training.decode_steps import Schedule, _jitted, _slice

__all__ = ["Answers", "Schedule", "answer_correctness", "answer_span", "decoded_metrics", "eval_answers",
           "eval_answers_seeds", "eval_correctness", "eval_correctness_seeds", "greedy"]


def _argmax(logits):
    return jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)


def _greedy(graphdef, state, prompts, positions, *, answer_length):
    model = nnx.merge(graphdef, state)
    batch, prompt_length = prompts.shape
    cache = model.init_cache(batch, prompt_length + answer_length - 1)
    logits, cache = model.decode(prompts, cache, _slice(positions, 0, prompt_length))
    token = _argmax(logits)
    out = jnp.zeros((batch, answer_length), jnp.int32).at[:, 0].set(token)

    def body(j, carry):
        cache, token, out = carry
        logits, cache = model.decode(token[:, None], cache, _slice(positions, prompt_length + j - 1, 1))
        token = _argmax(logits)
        return cache, token, out.at[:, j].set(token)

    return jax.lax.fori_loop(1, answer_length, body, (cache, token, out))[2]


def greedy(model, prompts, answer_length: int, *, positions=None):
    """The greedy answers [B, ``answer_length``] (int32) of ``prompts`` [B, P], one compiled loop.

    ``positions`` ([P + answer_length - 1] or [B, ...]): the positions of the
    prompt and answer tokens (default 0, 1, ...).
    """
    answer_length = int(answer_length)
    if answer_length < 1:
        raise ValueError(f"answer_length must be an integer >= 1; got {answer_length}")
    graphdef, state = nnx.split(model)
    prompts = jnp.asarray(prompts, jnp.int32)
    return _jitted(_greedy, ("answer_length",))(graphdef, state, prompts, positions,
                                                answer_length=answer_length)


@dataclasses.dataclass(frozen=True)
class Answers:
    """The decoded answers of one model over an evaluation set of ``N`` rows of length ``L``."""

    correct: np.ndarray  # bool [N, L]: answer tokens right decoded; a failing row not in the sample: right
    #                      up to its first error, False from there (what it decodes there is not known)
    mask: np.ndarray  # bool [N, L]: answer tokens
    first: np.ndarray  # int [N]: each row's first wrong answer target as decoding reads it (L: none)
    decoded: np.ndarray  # bool [N]: the failing rows decoded (all of them, or the sample)

    def metrics(self) -> dict:
        """``decoded_accuracy``, ``decoded_exact_match``, ``decoded_rows``, ``failing_rows``, ``decoded_accuracy_se``.

        Every failing row decoded: :func:`decoded_metrics`, exactly, and a standard error of 0.
        A sample: the exact match is still exact (a row is right decoded iff it has no first error)
        and the accuracy is :func:`posenc.training.decode_sample.estimate`'s unbiased estimate.
        """
        out = decoded_metrics(self.correct, self.mask)
        failing = self.first < self.mask.shape[1]
        out.update(decoded_rows=int(self.decoded.sum()), failing_rows=int(failing.sum()),
                   decoded_accuracy_se=None if out["decoded_accuracy"] is None else 0.0)
        if out["decoded_rows"] < out["failing_rows"]:
            out["decoded_accuracy"], out["decoded_accuracy_se"] = decode_sample.estimate(
                self.correct, self.mask, self.first, self.decoded)
        return out


def answer_correctness(model, batch, *, positions=None, stats=None, schedule: Schedule | None = None):
    """``(correct, mask)``, both bool [B, L]: which answer tokens greedy decoding gets right.

    ``batch``: ``inputs``, ``targets``, ``mask`` of a task (module docstring);
    ``positions``: the model's positions ([L] or [B, L]; default 0..L-1);
    ``stats``: a dict to fill with what was decoded (rows, groups, segments, steps);
    ``schedule``: the decoder's grouping and pacing (:class:`Schedule`; default: its defaults).
    ``correct`` is False wherever ``mask`` is.
    """
    schedule = schedule or Schedule()
    data = _make_set([(batch, positions)])
    graphdef, state = nnx.split(model)
    size = data.fed.shape[0]
    decoded = _run(graphdef, [(state,)], _single(graphdef, state), data, group=schedule.group(size), rows=size,
                   max_tokens=0, schedule=schedule, stats=stats)
    return decoded.correct[0], data.mask


def _eval_set(task, config, length: int, root, min_size):
    """The evaluation set at ``length`` (``decode_set._Set``): ``eval.num_batches`` batches of ``eval.batch_size``."""
    batch_size, positions = int(config.eval.batch_size), specs.Positions.from_config(config)
    if root is None:
        root = jax.random.fold_in(jax.random.key(int(config.eval.seed)), int(length))
    parts = [eval_lib.eval_batch(task, positions, jax.random.fold_in(root, i), batch_size, int(length),
                                 min_size=min_size) for i in range(int(config.eval.num_batches))]
    return _make_set(parts)


def _budget(config, length: int, schedule: Schedule) -> tuple[int, int, int]:
    """``(group, rows, max_tokens)``: rows decoded together, rows per teacher-forced forward, the bound."""
    batch_size = int(config.eval.batch_size)
    max_tokens = int(config.eval.get("max_tokens_per_step", 0))
    return schedule.group(batch_size), eval_lib.rows_per_step(batch_size, int(length), max_tokens), max_tokens


def _choose(config, length: int, decode_rows):
    """The ``choose`` of ``decode_set._decode_set`` for ``decode_rows`` (None: ``eval.decode_rows``)."""
    if decode_rows is None:
        decode_rows = config.eval.get("decode_rows", decode_sample.ALL)
    return decode_sample.chooser(decode_rows, seed=int(config.eval.seed), length=int(length))


def eval_answers(model, task, config, length: int, *, root=None, min_size=None, stats=None, first_errors=None,
                 decode_rows=None, schedule: Schedule | None = None) -> Answers:
    """The :class:`Answers` of greedy decoding over the evaluation set at ``length``.

    The examples (and randomized positions) of :func:`posenc.training.evaluate.evaluate_length`
    (``root``: its key; ``min_size``: its size bin): ``eval.num_batches`` batches of
    ``eval.batch_size``, decoded as :mod:`posenc.training.decode_set` says (no forward over more
    than ``eval.max_tokens_per_step`` tokens). ``stats``: a dict to fill with what was decoded.
    ``first_errors`` [N]: each row's first wrong answer target under the evaluation's teacher
    forcing (``eval_step.eval_length_fn(..., errors=True)``), which then replaces step 1.
    ``decode_rows``: failing rows decoded, an integer or "all" (default: ``eval.decode_rows``).
    """
    schedule = schedule or Schedule()
    data = _eval_set(task, config, length, root, min_size)
    graphdef, state = nnx.split(model)
    group, rows, max_tokens = _budget(config, length, schedule)
    d = _run(graphdef, [(state,)], _single(graphdef, state), data, group=group, rows=rows, max_tokens=max_tokens,
             schedule=schedule, choose=_choose(config, length, decode_rows), config=config, stats=stats,
             first_errors=first_errors)
    return Answers(d.correct[0], data.mask, d.first[0], d.decoded[0])


def eval_answers_seeds(graphdef, params, rest, task, config, length: int, *, root=None, min_size=None,
                       stats=None, first_errors=None, decode_rows=None,
                       schedule: Schedule | None = None) -> list[Answers]:
    """:func:`eval_answers` of S models of one graph at once: one :class:`Answers` per model.

    ``params``: their ``nnx.Param`` states stacked [S]; ``rest``: the other state of one of them.
    The examples are drawn once; the teacher-forced pass runs the S models in one ``jax.vmap``-ed
    call per row chunk, and each model decodes its own failing rows (one program for all of them;
    each model's sample is the one it would draw alone). Each model's answers are its own
    :func:`eval_answers`'s up to float32 rounding. ``first_errors`` [S, N]: one row per model.
    """
    schedule = schedule or Schedule()
    size = jax.tree.leaves(params)[0].shape[0]
    data = _eval_set(task, config, length, root, min_size)
    fn = _jitted(_forced_seeds, ("end",))

    def forced(fed, targets, mask, positions, end):
        return fn(graphdef, params, rest, fed, targets, mask, positions, end=end)

    models = [(jax.tree.map(lambda x: x[j], params), rest) for j in range(size)]
    group, rows, max_tokens = _budget(config, length, schedule)
    d = _run(graphdef, models, forced, data, group=group, rows=rows, max_tokens=max_tokens, schedule=schedule,
             choose=_choose(config, length, decode_rows), config=config, stats=stats, first_errors=first_errors)
    return [Answers(c, data.mask, d.first[j], d.decoded[j]) for j, c in enumerate(d.correct)]


def eval_correctness(model, task, config, length: int, *, root=None, min_size=None, stats=None,
                     first_errors=None, schedule: Schedule | None = None):
    """``(correct, mask)`` [N, L] of greedy decoding over the evaluation set at ``length``, every failing
    row decoded (whatever ``eval.decode_rows`` says): :func:`eval_answers`'s ``correct`` and ``mask``."""
    answers = eval_answers(model, task, config, length, root=root, min_size=min_size, stats=stats,
                           first_errors=first_errors, decode_rows=decode_sample.ALL, schedule=schedule)
    return answers.correct, answers.mask


def eval_correctness_seeds(graphdef, params, rest, task, config, length: int, *, root=None, min_size=None,
                           stats=None, first_errors=None, schedule: Schedule | None = None) -> list[tuple]:
    """:func:`eval_correctness` of S models of one graph at once: ``[(correct, mask)]``, one per model
    (:func:`eval_answers_seeds`, every failing row decoded)."""
    answers = eval_answers_seeds(graphdef, params, rest, task, config, length, root=root, min_size=min_size,
                                 stats=stats, first_errors=first_errors, decode_rows=decode_sample.ALL,
                                 schedule=schedule)
    return [(a.correct, a.mask) for a in answers]


def decoded_metrics(correct, mask) -> dict:
    """``decoded_accuracy`` (answer tokens right) and ``decoded_exact_match`` (examples all right).

    None where there is nothing to score (no answer tokens / no example with one).
    """
    correct, mask = np.asarray(correct, bool), np.asarray(mask, bool)
    has = mask.any(axis=1)
    tokens = int(mask.sum())
    exact = (correct | ~mask).all(axis=1) & has
    return {"decoded_accuracy": float(correct.sum() / tokens) if tokens else None,
            "decoded_exact_match": float(exact.sum() / has.sum()) if has.any() else None}
