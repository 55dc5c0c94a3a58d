"""Greedy decoding in one compiled loop (posenc.training.decode) equals a Python loop of cached
decode calls; decoded answers agree with teacher-forced argmax where the model is right; the
evaluation decoder (exact-match shortcut, row groups, prefill pieces, growing caches) gives the
answers of the decoder before it (one prefill and one loop over the whole answer span)."""

import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import helpers
from posenc.training import decode, decode_set, decode_steps, eval_step

B, P, A = 3, 5, 6


def python_greedy(model, prompts, answer_length, positions=None):
    """One jitted decode call per token, the loop in Python."""
    g, state = nnx.split(model)

    @jax.jit
    def step(state, tokens, cache, pos):
        return nnx.merge(g, state).decode(tokens, cache, pos)

    cache = model.init_cache(prompts.shape[0], prompts.shape[1] + answer_length - 1)
    pos = None if positions is None else positions[..., :prompts.shape[1]]
    logits, cache = step(state, prompts, cache, pos)
    out = [jnp.argmax(logits[:, -1], -1)]
    for j in range(1, answer_length):
        pos = None if positions is None else positions[..., prompts.shape[1] + j - 1:prompts.shape[1] + j]
        logits, cache = step(state, out[-1][:, None].astype(jnp.int32), cache, pos)
        out.append(jnp.argmax(logits[:, -1], -1))
    return np.stack([np.asarray(t) for t in out], axis=1)


@pytest.mark.parametrize("kind", ["rope", "alibi", "fox"])
def test_compiled_greedy_loop_equals_python_loop(kind):
    model = helpers.decoder(kind, perturb=0.5)  # noisy parameters: answers depend on the prompt
    prompts = helpers.tokens(B, P)
    tokens = np.asarray(decode.greedy(model, prompts, A))
    assert tokens.shape == (B, A) and tokens.dtype == np.int32
    np.testing.assert_array_equal(tokens, python_greedy(model, prompts, A))
    assert len({tuple(t) for t in tokens}) > 1
    # at explicit (shifted, per-example) positions too
    positions = 100 + 2 * jnp.arange(P + A - 1)[None] + jnp.arange(B)[:, None]
    np.testing.assert_array_equal(np.asarray(decode.greedy(model, prompts, A, positions=positions)),
                                  python_greedy(model, prompts, A, positions))


def test_teacher_forced_argmax_equals_decoded_tokens_when_the_model_is_right():
    """Fed its own greedy answer, the model's teacher-forced argmax is that answer (it is right
    on this data), and decoding the batch gets every answer token right."""
    model = helpers.decoder("rope", perturb=0.5)
    prompts = helpers.tokens(B, P)
    answer = np.asarray(decode.greedy(model, prompts, A))
    sequence = np.concatenate([np.asarray(prompts), answer], axis=1)  # P + A tokens
    inputs, targets = sequence[:, :-1], sequence[:, 1:]
    mask = np.zeros(inputs.shape, np.float32)
    mask[:, P - 1:] = 1.0  # every target from the first answer token on
    forced = np.asarray(jnp.argmax(model(jnp.asarray(inputs)), -1))
    np.testing.assert_array_equal(forced[:, P - 1:], answer)
    correct, m = decode.answer_correctness(model, {"inputs": inputs, "targets": targets, "mask": mask})
    assert m.sum() == B * A and correct[m].all() and not correct[~m].any()
    assert decode.decoded_metrics(correct, m) == {"decoded_accuracy": 1.0, "decoded_exact_match": 1.0}
    # one wrong target token: that token (and its example's exact match) is wrong, the rest right
    targets = targets.copy()
    targets[1, P + 1] = (targets[1, P + 1] + 1) % 16
    correct, m = decode.answer_correctness(model, {"inputs": inputs, "targets": targets, "mask": mask})
    assert correct[m].sum() == B * A - 1 and not correct[1, P + 1]
    assert decode.decoded_metrics(correct, m)["decoded_exact_match"] == pytest.approx(2 / 3)


def reference_predictions(model, inputs, mask):
    """Python loop: prompt up to the first answer target, then feed the prediction where the
    input is an answer token, the given token elsewhere; one full forward per position, of the
    whole row with the tokens not yet fed left as given (the model is causal: position t's logits
    see tokens 0..t only), so that every forward is one compiled program."""
    graphdef, state = nnx.split(model)
    forward = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x))
    pred = np.zeros(inputs.shape, np.int64)
    for b in range(inputs.shape[0]):
        fed = np.array(inputs[b])
        for t in range(inputs.shape[1]):
            if t > 0 and mask[b, t - 1] > 0:
                fed[t] = pred[b, t - 1]
            pred[b, t] = int(jnp.argmax(forward(state, jnp.asarray(fed[None]))[0, t]))
    return pred


def test_answers_anywhere_in_the_sequence_decode_with_given_tokens_between():
    """Answers interleaved with given tokens (recall's queries) and examples of different prompt
    lengths: the compiled loop equals the reference Python loop of full forwards."""
    model = helpers.decoder("alibi", perturb=0.5)
    inputs = np.asarray(helpers.tokens(2, 10))
    mask = np.zeros((2, 10), np.float32)
    mask[0, [3, 4, 7]] = 1.0
    mask[1, [5, 6, 8, 9]] = 1.0
    assert decode.answer_span(mask) == (4, 10)
    pred = reference_predictions(model, inputs, mask)
    # targets do not change what is fed: make some answers right, the others wrong
    targets = (pred + 1) % 16
    targets[0, [3, 7]] = pred[0, [3, 7]]
    targets[1, [6, 8, 9]] = pred[1, [6, 8, 9]]
    correct, m = decode.answer_correctness(model, {"inputs": inputs, "targets": targets, "mask": mask})
    np.testing.assert_array_equal(correct, (pred == targets) & (mask > 0))
    assert m.sum() == 7 and correct.sum() == 5
    assert decode.decoded_metrics(correct, m) == {"decoded_accuracy": 5 / 7, "decoded_exact_match": 0.0}


def test_eval_set_correctness_of_a_task():
    import importlib.util

    from posenc.model import Decoder
    from posenc.training import prepare

    module = importlib.import_module("posenc.configs.default")
    c = module.get_config("tiny")
    c.eval.update(batch_size=4, num_batches=2, max_tokens_per_step=32)  # 2 rows per forward
    r = prepare.resolve(c)
    model = Decoder(r.spec, rngs=nnx.Rngs(0))
    stats = {}
    correct, mask = decode.eval_correctness(model, r.task, r.config, 16, stats=stats)
    assert correct.shape == mask.shape == (8, 16)
    # the memory bound splits the teacher-forced forwards, not the decoding: every row of a batch
    # in one loop (a step holds one token per row), which ends at the last answer token
    assert stats["forced_rows_per_forward"] == 2
    assert [g["rows"] for g in stats["groups"]] == [4] * (stats["decoded_rows"] // 4) and stats["decoded_rows"]
    last = max(np.flatnonzero(row).max() for row in mask)
    assert max(g["stop"] for g in stats["groups"]) == last + 1 < 16
    n = r.task.max_size(16)  # copy: every eval example at the largest size, an answer of n tokens
    assert (mask.sum(axis=1) == n).all() and not correct[~mask].any()
    # the same examples as a direct decode of the evaluation batches
    key = jax.random.fold_in(jax.random.fold_in(jax.random.key(int(r.config.eval.seed)), 16), 1)
    batch, _ = eval_step.eval_batch(r.task, r.train.positions, key, 4, 16)
    direct, _ = decode.answer_correctness(model, batch)
    np.testing.assert_array_equal(correct[4:], direct)


# -- the evaluation decoder against the decoder before it ---------------------------------------------


def _old_forced(graphdef, state, inputs, mask, positions, *, start, end):
    """The decoder before the shortcut and the segments: every row prefilled up to the batch's first
    answer token, then one compiled loop to the batch's last, answers fed back."""
    model = nnx.merge(graphdef, state)
    batch, length = inputs.shape
    cache = model.init_cache(batch, end)
    logits, cache = model.decode(inputs[:, :start], cache, decode_steps._slice(positions, 0, start))
    token = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)
    out = jnp.full((batch, length), -1, jnp.int32).at[:, start - 1].set(token)

    def body(t, carry):
        cache, token, out = carry
        given = jax.lax.dynamic_index_in_dim(inputs, t, axis=1, keepdims=False)
        answer = jax.lax.dynamic_index_in_dim(mask, t - 1, axis=1, keepdims=False) > 0
        logits, cache = model.decode(jnp.where(answer, token, given)[:, None], cache,
                                     decode_steps._slice(positions, t, 1))
        token = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)
        return cache, token, jax.lax.dynamic_update_index_in_dim(out, token, t, axis=1)

    return jax.lax.fori_loop(start, end, body, (cache, token, out))[2]


_OLD = jax.jit(_old_forced, static_argnames=("start", "end"))


def old_decoding(model, batch, positions=None):
    """``(correct, predictions)`` of the decoder before (reference)."""
    mask = np.asarray(batch["mask"]) > 0
    start, end = decode.answer_span(mask)
    graphdef, state = nnx.split(model)
    predicted = np.asarray(_OLD(graphdef, state, jnp.asarray(batch["inputs"], jnp.int32),
                                jnp.asarray(mask, jnp.int32), positions, start=start, end=end))
    return (predicted == np.asarray(batch["targets"])) & mask, predicted


def engine(model, batch, positions=None, *, group, rows, max_tokens, stats, schedule):
    """The evaluation decoder on one batch with its knobs: rows decoded together, rows per
    teacher-forced forward, tokens per forward, the schedule."""
    data = decode_set._make_set([(batch, positions)])
    graphdef, state = nnx.split(model)
    (correct,) = decode_set._run(graphdef, [(state,)], decode_set._single(graphdef, state), data, group=group,
                                 rows=rows, max_tokens=max_tokens, schedule=schedule, stats=stats).correct
    return correct


@pytest.mark.parametrize("kind", ["rope", "alibi", "fox"])
def test_shortcut_decodes_only_wrong_rows_from_their_first_error(kind):
    """Rows right at every answer token are not decoded; the others from their first error on (in
    groups sorted by it, each prefilled up to its earliest error in pieces, its cache grown as it
    decodes); the answers are those of the decoder before, for rows all right, wrong from the first
    token, wrong late, wrong in the middle of answers interleaved with given tokens, and a row
    without answers."""
    schedule = decode.Schedule(min_prefill=0, cache_grid=4)  # cache sizes 4, 6, 8, 12, 16, 23
    model = helpers.decoder(kind, perturb=0.5)
    B, L = 8, 24
    inputs = np.asarray(helpers.tokens(B, L, seed=3))
    mask = np.zeros((B, L), np.float32)
    for row, answers in enumerate([range(8, 16), range(8, 16), range(5, 13), range(10, 21), [6, 7, 12, 13, 18],
                                   range(14, 23), range(3, 10), []]):
        mask[row, list(answers)] = 1.0
    batch = {"inputs": inputs, "targets": np.zeros_like(inputs), "mask": mask}
    _, predicted = old_decoding(model, batch)  # what decoding reads does not depend on the targets
    targets = np.where(mask > 0, predicted, 0)  # every answer token right ...
    first = {r: int(np.flatnonzero(mask[r])[0]) for r in range(7)}
    targets[2, first[2]] += 1  # ... but the first of row 2,
    targets[3, 20] += 1  # the last of row 3,
    targets[4, 12] += 1  # one in the middle of row 4 (answers 6 7 . . . . 12 13 . . . . 18)
    targets[5] = np.where(mask[5] > 0, predicted[5] + 1, 0)  # and all of row 5
    batch["targets"] = targets % 16
    expected, _ = old_decoding(model, batch)
    np.testing.assert_array_equal(expected, (predicted == batch["targets"]) & (mask > 0))
    assert expected[[0, 1, 6]][mask[[0, 1, 6]] > 0].all() and not expected[5].any()
    stats = {}
    correct = engine(model, batch, group=2, rows=4, max_tokens=8, stats=stats,
                     schedule=schedule)  # prefill pieces of 4 tokens
    np.testing.assert_array_equal(correct, expected)
    # rows 2, 4, 5, 3 (first errors 5, 12, 14, 20) are decoded, two at a time: from the piece holding
    # the group's first error to its last answer token
    assert stats["decoded_rows"] == 4
    assert [(g["rows"], g["start"], g["stop"]) for g in stats["groups"]] == [(2, 4, 19), (2, 12, 23)]
    assert stats["prefill_pieces"] == 1 + 3 and stats["steps"] == 15 + 11
    assert len(stats["cache_sizes"]) > 2  # the cache grew as the rows were decoded
    # the public entry point (one group, no memory bound) gives the same answers
    correct, m = decode.answer_correctness(model, batch, schedule=schedule)
    np.testing.assert_array_equal(correct, expected)
    np.testing.assert_array_equal(m, mask > 0)


def test_shortcut_with_explicit_and_per_example_positions():
    """Positions shared by every row (rotated once per step) and positions of each row."""
    schedule = decode.Schedule(min_prefill=0)
    model = helpers.decoder("rope", perturb=0.5)
    B, L = 4, 16
    inputs = np.asarray(helpers.tokens(B, L, seed=5))
    mask = np.zeros((B, L), np.float32)
    mask[:, 6:14] = 1.0
    mask[1, 9:] = 0.0
    for positions in (7 + 3 * jnp.arange(L), 100 + 2 * jnp.arange(L)[None] + 5 * jnp.arange(B)[:, None]):
        batch = {"inputs": inputs, "targets": np.zeros_like(inputs), "mask": mask}
        _, predicted = old_decoding(model, batch, positions)
        batch["targets"] = np.where(mask > 0, predicted, 0)
        batch["targets"][0, 10] += 1  # row 0 wrong at its 5th answer token, the others right
        expected, _ = old_decoding(model, batch, positions)
        assert expected[mask > 0].sum() == mask.sum() - 1
        stats = {}
        correct = engine(model, batch, positions, group=4, rows=4, max_tokens=4, stats=stats, schedule=schedule)
        np.testing.assert_array_equal(correct, expected)
        assert stats["decoded_rows"] == 1 and stats["groups"][0]["start"] == 8  # pieces of 4 tokens


def _task(arg):
    from posenc.training import prepare

    module = importlib.import_module("posenc.configs.default")
    c = module.get_config(arg)
    c.eval.update(batch_size=4, num_batches=2, max_tokens_per_step=32)
    return prepare.resolve(c)


@pytest.mark.parametrize("arg", ["tiny", "tiny,mqar", "tiny,randomized"])
def test_eval_set_decoding_equals_the_decoder_before(arg):
    """copy; mqar (answers spread between given tokens); randomized positions (each batch its own);
    the set's rows regrouped across batches, prefilled in pieces within the memory bound."""
    from posenc.model import Decoder
    from posenc.training import evaluate

    schedule = decode.Schedule(min_prefill=0, cache_grid=8)
    r = _task(arg)
    model = Decoder(r.spec, rngs=nnx.Rngs(1))
    helpers.perturb_params(model, jax.random.key(7), 0.3)
    n = 32
    plan = evaluate.plan_length(r.task, r.config, n)
    stats = {}
    correct, mask = decode.eval_correctness(model, r.task, r.config, n, min_size=plan.min_size, stats=stats,
                                            schedule=schedule)
    root = jax.random.fold_in(jax.random.key(int(r.config.eval.seed)), n)
    expected = []
    for i in range(2):
        batch, positions = eval_step.eval_batch(r.task, r.train.positions, jax.random.fold_in(root, i), 4, n,
                                                min_size=plan.min_size)
        expected.append(old_decoding(model, batch, positions)[0])
    np.testing.assert_array_equal(correct, np.concatenate(expected))
    assert mask.sum() > 0 and correct.sum() < mask.sum() and (correct.sum() > 0 or arg == "tiny,mqar")
    assert stats["prefill_pieces"] > 0 and all(g["piece"] * g["size"] <= 32 for g in stats["groups"])
    if arg == "tiny":  # two models of one graph decoded as a seed group
        from posenc.training import evaluate as ev

        other = Decoder(r.spec, rngs=nnx.Rngs(2))
        helpers.perturb_params(other, jax.random.key(8), 0.3)
        graphdef, params, rest = ev.split_params([model, other])
        together = decode.eval_correctness_seeds(graphdef, params, rest, r.task, r.config, n,
                                                 min_size=plan.min_size, schedule=schedule)
        np.testing.assert_array_equal(together[0][0], correct)
        alone, _ = decode.eval_correctness(other, r.task, r.config, n, min_size=plan.min_size, schedule=schedule)
        np.testing.assert_array_equal(together[1][0], alone)
