"""The evaluation decoder's cost and responsiveness (posenc.training.decode, decode_set, decode_steps): decoding
steps attend
densely, run in short compiled segments (Ctrl-C acts between them, a progress bar shows), and the
step programs are shared by every length (benchmarks/decode_speed.py measures the speed)."""

import _thread
import importlib.util
import os

import numpy as np
import pytest
from flax import nnx

import helpers
from posenc.model import Decoder
from posenc.model import attention as attention_lib
from posenc.training import decode, decode_set, decode_steps, eval_step, evaluate, prepare
from posenc.training import progress as progress_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def resolved(arg="tiny", **model):
    module = importlib.import_module("posenc.configs.default")
    c = module.get_config(arg)
    c.eval.update(batch_size=4, num_batches=2)
    c.model.update(model)
    return prepare.resolve(c)


def test_a_step_attends_densely_to_the_cache(monkeypatch):
    """One query per row: the blocked path would pad it to a block of queries (512 by default),
    which made every step cost as much as a block of a full forward."""
    calls = []
    blocked = attention_lib.blocked_attention

    def spy(q, *args, **kwargs):
        calls.append(q.shape[1])
        return blocked(q, *args, **kwargs)

    monkeypatch.setattr(attention_lib, "blocked_attention", spy)
    r = resolved(attention_block=4)  # blocks of 4: the forward and the prefill run blocked
    model = Decoder(r.spec, rngs=nnx.Rngs(3))
    correct, mask = decode.eval_correctness(model, r.task, r.config, 24)
    assert not correct.all() and calls and min(calls) > 1


def _fake_bar(events, interrupt_after=None):
    class Bar:
        unit = ""

        def __init__(self, *args, **kwargs):
            events.append(("new", kwargs.get("desc")))

        def reset(self, total=None):
            events.append(("reset", total))

        def set_description(self, desc):
            events.append(("desc", desc))

        def update(self, k):
            events.append(("update", self.unit))
            if interrupt_after and events.count(("update", "step")) == interrupt_after:
                _thread.interrupt_main()  # Ctrl-C, as a signal: raised in the main thread

        def set_postfix_str(self, s):
            pass

        def close(self):
            events.append(("close", None))

    return Bar


@pytest.mark.usefixtures("python_sigint")
def test_ctrl_c_acts_between_segments(monkeypatch):
    """The steps run in compiled segments of about Schedule.segment_seconds with the loop state carried
    between calls: a KeyboardInterrupt acts at the end of the running segment, not of the length."""
    schedule = decode.Schedule(segment_seconds=0.0, first_segment=1)  # one step a segment
    events = []
    monkeypatch.setattr(progress_lib, "progress", _fake_bar(events, interrupt_after=3))
    r = resolved()
    r.config.train.progress = True
    model = Decoder(r.spec, rngs=nnx.Rngs(0))
    with pytest.raises(KeyboardInterrupt):
        decode.eval_correctness(model, r.task, r.config, 32, schedule=schedule)
    assert events.count(("update", "step")) == 3 and events[-1] == ("close", None)
    # the whole length takes many more segments, and runs again once interrupted
    monkeypatch.setattr(progress_lib, "progress", _fake_bar([]))
    stats = {}
    correct, mask = decode.eval_correctness(model, r.task, r.config, 32, stats=stats, schedule=schedule)
    assert stats["segments"] > 10 and stats["steps"] == stats["segments"] and mask.sum() > 0


def test_a_progress_bar_per_length_on_stderr(capfd):
    schedule = decode.Schedule(progress_delay=0.0)
    r = resolved()
    model = Decoder(r.spec, rngs=nnx.Rngs(0))
    r.config.train.progress = True
    decode.eval_correctness(model, r.task, r.config, 16, schedule=schedule)
    err = capfd.readouterr().err
    assert "decode 16: teacher-forced" in err and "decode 16: 8/8 rows" in err
    r.config.train.progress = False  # the run's progress setting (tiny turns it off)
    decode.eval_correctness(model, r.task, r.config, 16, schedule=schedule)
    assert "decode" not in capfd.readouterr().err


def test_step_programs_are_shared_by_lengths_and_groups():
    """A segment program per (rows, cache size): the cache sizes come from one grid at every length
    and a program's inputs are cut to its cache, so a length compiles only the pairs no length
    before it used; the cache grows with the decoded tokens, up to the set's last answer token."""
    schedule = decode.Schedule(cache_grid=8)
    r = resolved(d_model=24)  # a graph of its own: no program of another test
    model = Decoder(r.spec, rngs=nnx.Rngs(0))
    segment = decode_steps._jitted(decode_steps._segment, (), ("cache", "out"))
    seen = set()
    for n in (32, 64):
        before = segment._cache_size()
        stats = {}
        decode.eval_correctness(model, r.task, r.config, n, stats=stats, schedule=schedule)
        pairs = {(g["size"], s) for g in stats["groups"] for s in g["cache_sizes"]}
        assert segment._cache_size() - before == len(pairs - seen)
        seen |= pairs
        for g in stats["groups"]:
            assert g["cache_sizes"] == sorted(g["cache_sizes"]) and g["cache_sizes"][-1] >= g["stop"]
    assert {s for _, s in seen} >= {8, 12, 16, 24}  # the grid 8, 12, 16, 24, 32, 48, ...
    capacity = decode_steps._capacity
    assert capacity(1, 1000, 8) == 8 and capacity(9, 1000, 8) == 12 and capacity(13, 20, 8) == 16
    assert capacity(17, 20, 8) == 20  # at most the set's last answer token
    assert capacity(1, 1000) == 256 and capacity(257, 1000) == 384  # the default grid


def test_bucket_and_piece_sizes():
    assert [decode_set._bucket(n, 8) for n in (1, 2, 3, 5, 8)] == [1, 2, 4, 8, 8]
    assert decode_set._bucket(5, 6) == 6
    assert decode_set._piece(512, 8, 16384) == 512 and decode_set._piece(512, 8, 1000) == 64
    assert decode_set._piece(512, 8, 0) == 512 and decode_set._piece(512, 8, 4) == 1
    assert decode.Schedule(group_rows=4).group(8) == 4 and decode.Schedule(group_rows=16).group(8) == 8
    np.testing.assert_array_equal(decode_set._make_set([({"inputs": np.array([[1, 5, 6, 7]]),
                                                      "targets": np.array([[5, 9, 7, 0]]),
                                                      "mask": np.array([[0, 1, 1, 0]])}, None)]).fed,
                                  [[1, 5, 9, 7]])  # answers read back as their targets


@pytest.mark.parametrize("kind, position, rotated", [
    ("rope", {}, True), ("rope", {"scaling": "yarn", "factor": 4.0, "original_length": 8}, True),
    ("irope", {}, True), ("rope", {"scaling": "dynamic", "factor": 2.0, "original_length": 8}, False),
    ("xpos", {}, False), ("rope", {"remap": "rerope", "window": 4}, False), ("alibi", {}, False)])
def test_a_static_key_transform_is_cached_transformed(kind, position, rotated):
    """Keys rotated by their own position alone are cached rotated, once (a step then rotates its own
    token, not the whole cache: about two thirds of a RoPE step at 4K tokens); keys whose transform
    depends on the length (dynamic NTK), the queries (xPos) or a remapping are cached as projected.
    The decoded logits equal the full forward's either way (dynamic NTK: test_conformance)."""
    model = helpers.decoder(kind, position=position, perturb=0.02)
    tokens = helpers.tokens(batch=2, length=12)
    cache = model.init_cache(2, 12)
    logits, cache = model.decode(tokens[:, :7], cache)
    for t in range(7, 12):
        step, cache = model.decode(tokens[:, t:t + 1], cache)
        logits = np.concatenate([logits, step], axis=1)
    if position.get("scaling") != "dynamic":  # step t's frequencies are those of t + 1 tokens (conformance)
        np.testing.assert_allclose(logits, model(tokens, deterministic=True), atol=2e-5, rtol=2e-5)
    attn = model.blocks[0].attn
    assert attn.encoding.static_key() == rotated
    _, k, _, _ = attn.project(model.blocks[0].norm1(model.embed_tokens(tokens)))  # pre-norm: layer 0's input
    want = attn.encoding.key(k, np.arange(12), seq_len=12) if rotated else k
    np.testing.assert_allclose(cache["k"][0], want, atol=1e-5)


def test_decoding_starts_from_the_evaluations_own_teacher_forcing(monkeypatch):
    """The evaluation program also gives each row's first wrong answer target (``errors=True``),
    the first errors decoding's own teacher-forced pass finds: an evaluated length runs that pass
    once, and decodes the same answers."""
    r = resolved()
    model = Decoder(r.spec, rngs=nnx.Rngs(0))
    length = 24
    plan = evaluate.plan_length(r.task, r.config, length)
    root = evaluate._root(r.config, length)
    graphdef, state = nnx.split(model)

    def program(errors):
        return eval_step.eval_length_fn(r.task, r.train.positions, length, plan.batch_size, plan.num_batches,
                                        rows=plan.rows, per_position=plan.per_position, min_size=plan.min_size,
                                        errors=errors)(graphdef, state, root)

    totals, plain = program(True), program(False)
    assert set(totals) == set(plain) | {"first_error"}
    for k in plain:  # the sums are those of the program without it
        np.testing.assert_array_equal(totals[k], plain[k])
    data = decode._eval_set(r.task, r.config, length, root, plan.min_size)
    assert data.fed_is_inputs
    own_first = decode_set._first_wrong(decode_set._single(graphdef, state), data, 1, plan.rows, None)[0]
    np.testing.assert_array_equal(totals["first_error"], own_first)
    assert (own_first < length).any() and totals["first_error"].shape == (plan.num_batches * plan.batch_size,)

    own, reused = {}, {}
    a, _ = decode.eval_correctness(model, r.task, r.config, length, root=root, min_size=plan.min_size, stats=own)
    b, _ = decode.eval_correctness(model, r.task, r.config, length, root=root, min_size=plan.min_size,
                                   stats=reused, first_errors=totals["first_error"])
    assert own["forced_pass"] == "own" and reused["forced_pass"] == "evaluation"
    np.testing.assert_array_equal(a, b)

    passes = []
    first_wrong = decode_set._first_wrong
    monkeypatch.setattr(decode_set, "_first_wrong", lambda *a, **k: passes.append(1) or first_wrong(*a, **k))
    row = evaluate.evaluate_length(model, r.task, r.config, r.spec, length)
    assert passes == [] and row["decoded_accuracy"] == decode.decoded_metrics(a, data.mask)["decoded_accuracy"]
