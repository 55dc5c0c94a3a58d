"""Greedy decoding in one compiled loop (posenc.training.decode) equals a Python loop of cached
decode calls; decoded answers agree with teacher-forced argmax where the model is right."""

import helpers
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posenc.training import decode
from posenc.training import eval_step

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
    input is an answer token, the given token elsewhere; one full forward per position."""
    pred = np.zeros(inputs.shape, np.int64)
    for b in range(inputs.shape[0]):
        fed = list(inputs[b])
        for t in range(inputs.shape[1]):
            if t > 0 and mask[b, t - 1] > 0:
                fed[t] = pred[b, t - 1]
            pred[b, t] = int(jnp.argmax(model(jnp.asarray([fed[:t + 1]]))[0, -1]))
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
    import os

    from posenc.model import Decoder
    from posenc.training import prepare

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.util.spec_from_file_location("cfg_default", os.path.join(root, "configs", "default.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    c = module.get_config("tiny")
    c.eval.update(batch_size=4, num_batches=2, max_tokens_per_step=32)  # 2 rows per decode
    r = prepare.resolve(c)
    model = Decoder(r.spec, rngs=nnx.Rngs(0))
    correct, mask = decode.eval_correctness(model, r.task, r.config, 16)
    assert correct.shape == mask.shape == (8, 16)
    n = r.task.max_size(16)  # copy: every eval example at the largest size, an answer of n tokens
    assert (mask.sum(axis=1) == n).all() and not correct[~mask].any()
    # the same examples as a direct decode of the evaluation batches
    key = jax.random.fold_in(jax.random.fold_in(jax.random.key(int(r.config.eval.seed)), 16), 1)
    batch, _ = eval_step.eval_batch(r.task, r.config, key, 4, 16)
    direct, _ = decode.answer_correctness(model, batch)
    np.testing.assert_array_equal(correct[4:], direct)
