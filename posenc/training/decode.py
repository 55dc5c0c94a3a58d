"""Greedy decoding with the KV cache, in one compiled loop over tokens.

    tokens = decode.greedy(model, prompts, answer_length)       # prompts [B, P]: BOS problem SEP
    correct, mask = decode.answer_correctness(model, batch)     # per example, per position [B, L]
    correct, mask = decode.eval_correctness(model, task, config, length)  # the eval set at length
    [(correct, mask), ...] = decode.eval_correctness_seeds(graphdef, params, rest, task, config, length)
    decode.decoded_metrics(correct, mask)  # {"decoded_accuracy": ..., "decoded_exact_match": ...}

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
tokens right. With every answer token predicted right under teacher forcing,
decoding feeds exactly the true tokens and gives the same predictions; the
two measures part where one early mistake changes what the model reads
next.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from posenc.training import eval_step as eval_lib

_JIT: dict = {}


def _argmax(logits):
    return jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)


def _slice(positions, start, size):
    if positions is None:
        return None
    return jax.lax.dynamic_slice_in_dim(positions, start, size, axis=positions.ndim - 1)


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


def _forced(graphdef, state, inputs, mask, positions, *, start, end):
    """Predictions [B, L] for targets ``start - 1 .. end - 1`` (-1 elsewhere), answers fed back."""
    return _forced_model(nnx.merge(graphdef, state), inputs, mask, positions, start, end)


def _forced_seeds(graphdef, params, rest, inputs, mask, positions, *, start, end):
    """:func:`_forced` of S models of one graph (``params`` stacked [S]): predictions [S, B, L]."""
    return jax.vmap(lambda p: _forced_model(nnx.merge(graphdef, p, rest), inputs, mask, positions,
                                            start, end))(params)


def _forced_model(model, inputs, mask, positions, start, end):
    batch, length = inputs.shape
    cache = model.init_cache(batch, end)
    logits, cache = model.decode(inputs[:, :start], cache, _slice(positions, 0, start))
    token = _argmax(logits)
    out = jnp.full((batch, length), -1, jnp.int32).at[:, start - 1].set(token)

    def body(t, carry):
        cache, token, out = carry
        given = jax.lax.dynamic_index_in_dim(inputs, t, axis=1, keepdims=False)
        answer = jax.lax.dynamic_index_in_dim(mask, t - 1, axis=1, keepdims=False) > 0
        fed = jnp.where(answer, token, given)
        logits, cache = model.decode(fed[:, None], cache, _slice(positions, t, 1))
        token = _argmax(logits)
        return cache, token, jax.lax.dynamic_update_index_in_dim(out, token, t, axis=1)

    return jax.lax.fori_loop(start, end, body, (cache, token, out))[2]


def _jitted(fn, static):
    if (fn, static) not in _JIT:
        _JIT[(fn, static)] = jax.jit(fn, static_argnames=static)
    return _JIT[(fn, static)]


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


def answer_span(mask) -> tuple[int, int] | None:
    """``(start, end)``: prompts are ``inputs[:, :start]``, the last answer target is ``end - 1``.

    ``start`` is one past the earliest first answer target of any example,
    ``end`` one past the latest answer target; None if no example has one.
    """
    m = np.asarray(mask) > 0
    rows = m.any(axis=1)
    if not rows.any():
        return None
    first = np.argmax(m[rows], axis=1)
    last = m.shape[1] - 1 - np.argmax(m[rows][:, ::-1], axis=1)
    return int(first.min()) + 1, int(last.max()) + 1


def answer_correctness(model, batch, *, positions=None, span=None):
    """``(correct, mask)``, both bool [B, L]: which answer tokens greedy decoding gets right.

    ``batch``: ``inputs``, ``targets``, ``mask`` of a task (module docstring);
    ``positions``: the model's positions ([L] or [B, L]; default 0..L-1);
    ``span``: :func:`answer_span` to decode over (default: the batch's own; one span for
    every batch of a length compiles one program). ``correct`` is False wherever ``mask`` is.
    """
    mask = np.asarray(batch["mask"]) > 0
    span = answer_span(mask) if span is None else span
    if span is None:
        return np.zeros_like(mask), mask
    graphdef, state = nnx.split(model)
    predicted = _jitted(_forced, ("start", "end"))(
        graphdef, state, jnp.asarray(batch["inputs"], jnp.int32), jnp.asarray(mask, jnp.int32),
        positions, start=span[0], end=span[1])
    correct = (np.asarray(predicted) == np.asarray(batch["targets"])) & mask
    return correct, mask


def _eval_set(task, config, length: int, root, min_size):
    """``([(rows, positions)], span)``: the evaluation set's row chunks and the span decoded over."""
    batch_size = int(config.eval.batch_size)
    rows = eval_lib.rows_per_step(batch_size, int(length), int(config.eval.get("max_tokens_per_step", 0)))
    if root is None:
        root = jax.random.fold_in(jax.random.key(int(config.eval.seed)), int(length))
    parts = []
    for i in range(int(config.eval.num_batches)):
        batch, positions = eval_lib.eval_batch(task, config, jax.random.fold_in(root, i), batch_size,
                                               int(length), min_size=min_size)
        for lo in range(0, batch_size, rows):
            part = {k: np.asarray(v[lo:lo + rows]) for k, v in batch.items()}
            pos = positions if positions is None or positions.ndim == 1 else positions[lo:lo + rows]
            parts.append((part, pos))
    spans = [s for s in (answer_span(p["mask"]) for p, _ in parts) if s is not None]
    span = (min(s[0] for s in spans), max(s[1] for s in spans)) if spans else None
    return parts, span


def eval_correctness(model, task, config, length: int, *, root=None, min_size=None):
    """``(correct, mask)`` [N, L] of greedy decoding over the evaluation set at ``length``.

    The examples (and randomized positions) of :func:`posenc.training.evaluate.evaluate_length`
    (``root``: its key; ``min_size``: its size bin): ``eval.num_batches`` batches of
    ``eval.batch_size``, decoded in row chunks of at most ``eval.max_tokens_per_step`` tokens,
    every chunk over the span of the whole set (one compiled program per length).
    """
    parts, span = _eval_set(task, config, length, root, min_size)
    corrects, masks = [], []
    for part, pos in parts:
        correct, mask = answer_correctness(model, part, positions=pos, span=span)
        corrects.append(correct)
        masks.append(mask)
    return np.concatenate(corrects), np.concatenate(masks)


def eval_correctness_seeds(graphdef, params, rest, task, config, length: int, *, root=None,
                           min_size=None) -> list[tuple]:
    """:func:`eval_correctness` of S models of one graph at once: ``[(correct, mask)]``, one per model.

    ``params``: their ``nnx.Param`` states stacked [S]; ``rest``: the other state of one of them.
    Every chunk is decoded for the S models in one ``jax.vmap``-ed call (the examples drawn once);
    each model's answers are its own :func:`eval_correctness`'s up to float32 rounding of the
    batched matmuls (an argmax tie may break the other way).
    """
    size = jax.tree.leaves(params)[0].shape[0]
    parts, span = _eval_set(task, config, length, root, min_size)
    masks = [np.asarray(part["mask"]) > 0 for part, _ in parts]
    if span is None:
        nothing = np.concatenate(masks)
        return [(np.zeros_like(nothing), nothing) for _ in range(size)]
    fn, corrects = _jitted(_forced_seeds, ("start", "end")), []
    for (part, pos), mask in zip(parts, masks):
        predicted = fn(graphdef, params, rest, jnp.asarray(part["inputs"], jnp.int32),
                       jnp.asarray(mask, jnp.int32), pos, start=span[0], end=span[1])
        corrects.append((np.asarray(predicted) == np.asarray(part["targets"])[None]) & mask[None])
    correct, mask = np.concatenate(corrects, axis=1), np.concatenate(masks)
    return [(correct[j], mask) for j in range(size)]


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
