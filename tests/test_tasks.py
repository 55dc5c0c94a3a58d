"""Synthetic tasks: exact formats and answers recomputed in Python, determinism, jit, sizes, errors."""

import functools
import inspect
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import posenc.tasks as tasks
from posenc.tasks import BOS, EOS, FIRST_SYMBOL, PAD, PLUS, SEP, digits, registry
from posenc.tasks.base import Task, compose

LENGTH = 30
BATCH = 24

CASES = [
    ("copy", {}),
    ("copy", {"alphabet": 3}),
    ("reverse", {}),
    ("sort", {"alphabet": 5}),
    ("parity", {}),
    ("recall", {}),
    ("recall", {"keys": 5, "values": 3}),
]
IDS = [f"{name}-{'-'.join(f'{k}{v}' for k, v in opts.items()) or 'default'}" for name, opts in CASES]


def full(batch):
    """The whole sequences [B, L+1] and the mask aligned with them (0 at position 0)."""
    inputs, targets, mask = (np.asarray(batch[k]) for k in ("inputs", "targets", "mask"))
    np.testing.assert_array_equal(inputs[:, 1:], targets[:, :-1])  # targets are the next tokens
    seq = np.concatenate([inputs[:, :1], targets], axis=1)
    return seq, np.concatenate([np.zeros((len(seq), 1)), mask], axis=1)


def reference(task, row):
    """Parse one example, recompute it in plain Python: (n, tokens, answer positions)."""
    row = [int(t) for t in row]
    assert row[0] == BOS
    sym = lambda t: t - FIRST_SYMBOL  # noqa: E731
    s = row.index(SEP)
    problem = row[1:s]
    if task.name == "recall":
        n = (s - 1) // 2
        keys, values = [sym(t) for t in problem[0::2]], [sym(t) - task.keys for t in problem[1::2]]
        assert len(keys) == len(values) == n and len(set(keys)) == n  # distinct keys
        assert all(0 <= k < task.keys for k in keys) and all(0 <= v < task.values for v in values)
        queries = row[s + 1 : s + 1 + 2 * n : 2]
        assert sorted(queries) == sorted(problem[0::2])  # every key queried once
        lookup = dict(zip(problem[0::2], problem[1::2]))
        answer = [t for q in queries for t in (q, lookup[q])]
        return n, [BOS] + problem + [SEP] + answer, list(range(s + 2, s + 1 + 2 * n, 2))
    n = s - 1
    alphabet = 2 if task.name == "parity" else task.alphabet
    x = [sym(t) for t in problem]
    assert all(0 <= v < alphabet for v in x)
    answer = {
        "copy": lambda: x,
        "reverse": lambda: x[::-1],
        "sort": lambda: sorted(x),
        "parity": lambda: [sum(x) % 2],
    }[task.name]()
    tokens = [BOS] + problem + [SEP] + [FIRST_SYMBOL + v for v in answer]
    return n, tokens, list(range(n + 2, n + 2 + len(answer)))


def check(task, batch, length):
    """Every row equals its Python reference, PAD after it, mask exactly on the answer; returns sizes."""
    seq, mask = full(batch)
    assert batch["inputs"].dtype == np.int32 and batch["targets"].dtype == np.int32
    assert batch["mask"].dtype == np.float32
    assert seq.shape == (len(seq), length + 1) and seq.min() >= 0 and seq.max() < task.vocab_size
    sizes = []
    for row, m in zip(seq, mask):
        n, tokens, answer = reference(task, row)
        assert len(tokens) == task.seq_len(n) <= length + 1
        expected = tokens + [PAD] * (length + 1 - len(tokens))
        np.testing.assert_array_equal(row, expected)
        expected_mask = np.zeros(length + 1)
        expected_mask[answer] = 1.0
        np.testing.assert_array_equal(m, expected_mask)
        sizes.append(n)
    return np.array(sizes)


@pytest.fixture(scope="module", params=CASES, ids=IDS)
def case(request):
    """(task, jitted batch, traces): every test of a case reuses one jitted function."""
    name, opts = request.param
    task = tasks.make(name, **opts)
    traces = []

    def batch(key, batch_size, length, min_size=None, split="train"):
        traces.append((batch_size, length, min_size, split))
        return task.batch(key, batch_size, length, min_size=min_size, split=split)

    return task, jax.jit(batch, static_argnums=(1, 2), static_argnames=("min_size", "split")), traces


def test_train_batch_format_answers_and_sizes(case):
    task, batch, _ = case
    sizes = check(task, batch(jax.random.key(0), BATCH, LENGTH), LENGTH)
    max_n = task.max_size(LENGTH)
    assert sizes.min() >= 1 and sizes.max() <= max_n
    assert len(set(sizes.tolist())) > 1  # sizes are drawn, not fixed


def test_eval_split_uses_max_size(case):
    task, batch, _ = case
    sizes = check(task, batch(jax.random.key(1), BATCH, LENGTH, split="eval"), LENGTH)
    assert set(sizes.tolist()) == {task.max_size(LENGTH)}


def test_min_size_is_honoured(case):
    task, batch, _ = case
    max_n = task.max_size(LENGTH)
    lo = max(1, max_n - 1)
    sizes = check(task, batch(jax.random.key(2), BATCH, LENGTH, min_size=lo), LENGTH)
    assert set(sizes.tolist()) <= set(range(lo, max_n + 1))
    with pytest.raises(ValueError, match=f"min_size {max_n + 1} is outside"):
        task.batch(jax.random.key(2), BATCH, LENGTH, min_size=max_n + 1)
    with pytest.raises(ValueError, match="min_size 0 is outside"):
        task.batch(jax.random.key(2), BATCH, LENGTH, min_size=0)


def test_determinism(case):
    _, batch, _ = case
    a = batch(jax.random.key(3), BATCH, LENGTH)
    b = batch(jax.random.key(3), BATCH, LENGTH)
    c = batch(jax.random.key(4), BATCH, LENGTH)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    assert not np.array_equal(a["inputs"], c["inputs"])


def test_single_trace_per_shape(case):
    _, batch, traces = case
    batch(jax.random.key(5), BATCH, LENGTH)
    batch(jax.random.key(6), BATCH, LENGTH)
    assert traces.count((BATCH, LENGTH, None, "train")) == 1
    assert len(traces) == len(set(traces))  # no shape or option was traced twice


def test_metadata_is_json(case):
    task = case[0]
    meta = json.loads(json.dumps(task.metadata()))
    assert meta["name"] == task.name and meta["vocab_size"] == task.vocab_size
    assert tasks.make(task.name, **task.options()).metadata() == meta


def test_jit_of_bound_batch_matches_eager_and_seed_changes_data():
    task = tasks.make("copy")
    eager = task.batch(jax.random.key(0), 4, 20)
    jitted = jax.jit(task.batch, static_argnums=(1, 2))  # the contract's spelling
    for k, v in jitted(jax.random.key(0), 4, 20).items():
        np.testing.assert_array_equal(v, eager[k])
    evaluate = jax.jit(functools.partial(task.batch, split="eval"), static_argnums=(1, 2))
    assert set(check(task, evaluate(jax.random.key(5), 4, 20), 20).tolist()) == {task.max_size(20)}
    # Tasks differing only in seed share the compile but not the data.
    other = tasks.make("copy", seed=1).batch(jax.random.key(0), 4, 20)
    check(task, other, 20)
    assert not np.array_equal(other["inputs"], eager["inputs"])


SIZED = [n for n in tasks.TASKS if n != "text"]


@given(length=st.integers(1, 600))
def test_max_size_is_the_largest_that_fits(length):
    # Every registered size law, linear or not, is inverted exactly by max_size.
    for name in SIZED:
        task = tasks.make(name, keys=1000) if name == "recall" else tasks.make(name)
        if length < task.min_length():
            with pytest.raises(ValueError, match=f"length {length} is too short.*>= {task.min_length()}"):
                task.max_size(length)
            continue
        n = task.max_size(length)
        assert n >= task.smallest and task.seq_len(n) <= length + 1
        assert n == task.size_cap or task.seq_len(n + 1) > length + 1
        # Evaluating at 4x the length poses problems at least 4x larger (up to the size cap); 2x for
        # the grids' side k (2 k^2 + 2 tokens)
        grow = 2 if task.law == "2 * n^2 + 2" else 4
        assert task.max_size(4 * length) >= min(grow * n, task.size_cap or grow * n)


def test_max_size_grows_with_length_and_recall_is_capped_by_keys():
    copy = tasks.make("copy")
    assert [copy.max_size(L) for L in (3, 16, 64, 256)] == [1, 7, 31, 127]
    assert tasks.make("addition").max_size(64) == 20  # 3 * 20 + 5 = 65 tokens
    recall = tasks.make("recall", keys=4)
    assert recall.max_size(100) == 4
    check(recall, recall.batch(jax.random.key(0), 8, 40, split="eval"), 40)


@pytest.mark.parametrize("name,minimum", [("copy", 3), ("reverse", 3), ("sort", 3), ("parity", 3),
                                          ("recall", 5), ("addition", 7)])
def test_too_short_length_names_length_and_minimum(name, minimum):
    task = tasks.make(name)
    assert task.min_length() == minimum
    with pytest.raises(ValueError, match=f"length {minimum - 1} is too short for task '{name}'.*>= {minimum}"):
        task.batch(jax.random.key(0), 2, minimum - 1)
    task.max_size(minimum)  # the minimum itself is fine


ALL_NAMES = [
    "copy", "reverse", "sort", "parity", "parity_check", "recall", "addition", "multi_addition",
    "multiplication", "even_pairs", "modular_arithmetic", "cycle_navigation",
    "stack_manipulation", "reverse_string", "modular_arithmetic_brackets", "solve_equation",
    "duplicate_string", "odds_first", "bucket_sort", "missing_duplicate_string", "binary_addition",
    "binary_multiplication", "compute_sqrt",
    "polynomial", "summation", "lego", "count", "mqar", "flip_flop", "induction", "passkey", "text",
    "grid_copy", "grid_transpose", "niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery",
    "variable_tracking", "vt", "common_words", "cwe", "frequent_words", "fwe",
]


def test_make_errors():
    with pytest.raises(ValueError, match=f"unknown task 'cpy'; choose one of: {', '.join(ALL_NAMES)}$"):
        tasks.make("cpy")
    with pytest.raises(ValueError, match="unknown option 'alphabt' for task 'copy'; choose from: alphabet, "
                                         "coupled, max_position$"):
        tasks.make("copy", alphabt=4)
    with pytest.raises(ValueError, match="unknown option 'keys' for task 'parity_check'; choose from: \\(none\\)"):
        tasks.make("parity_check", keys=4)
    with pytest.raises(ValueError, match="unknown option 'slot' for task 'mqar'; choose from: keys, values, "
                                         "slots, power_a, random_non_queries$"):
        tasks.make("mqar", slot=2)
    with pytest.raises(ValueError, match="alphabet must be an integer >= 2; got 1"):
        tasks.make("copy", alphabet=1)
    with pytest.raises(ValueError, match="unknown format 'lsd'; choose one of: msd, reversed, reversed_output, "
                                         "reversed_padded"):
        tasks.make("addition", format="lsd")
    with pytest.raises(ValueError, match="unknown split 'test'; choose one of: train, eval"):
        tasks.make("copy").batch(jax.random.key(0), 2, 8, split="test")
    with pytest.raises(ValueError, match="min_size 1 is outside \\[2, 6\\] \\(sizes of task 'lego' at length 33\\)"):
        tasks.make("lego").batch(jax.random.key(0), 2, 33, min_size=1)
    assert list(tasks.TASKS) == ALL_NAMES


def test_vocab_sizes_and_token_ids():
    assert (PAD, BOS, SEP, EOS, FIRST_SYMBOL, PLUS) == (0, 1, 2, 3, 4, 14)
    assert tasks.make("copy", alphabet=16).vocab_size == 20
    assert tasks.make("parity").vocab_size == 6
    assert tasks.make("recall", keys=64, values=16).vocab_size == 84
    assert tasks.make("addition").vocab_size == 15


def test_digit_sums_match_python():
    rng = np.random.default_rng(0)
    width = 9
    # Random digits plus the carry-chain edge cases (all nines, 999 + 1, zeros).
    a = rng.integers(0, 10, (200, width))
    b = rng.integers(0, 10, (200, width))
    edge_a = np.array([[9] * 8 + [0], [9] * 3 + [0] * 6, [0] * 9, [5, 9, 9, 9, 0, 0, 0, 0, 0]])
    edge_b = np.array([[9] * 8 + [0], [1] + [0] * 8, [0] * 9, [5, 0, 0, 0, 0, 0, 0, 0, 0]])
    a, b = np.concatenate([a[:, :-1], edge_a[:, :-1]]), np.concatenate([b[:, :-1], edge_b[:, :-1]])
    a, b = np.pad(a, ((0, 0), (0, 1))), np.pad(b, ((0, 0), (0, 1)))  # top digit 0 for the carry
    c = np.asarray(jax.vmap(lambda x, y: digits.add_many(jnp.stack([x, y])))(a, b))
    to_int = lambda ds: int("".join(str(int(d)) for d in ds[::-1]))  # noqa: E731
    for x, y, z in zip(a, b, c):
        assert to_int(z) == to_int(x) + to_int(y)


# ------------------------------------------------------------------ registry
def test_registry_is_read_off_the_classes():
    for name in tasks.TASKS:
        cls = tasks.task_class(name)
        assert name in cls.names and cls.name == cls.names[0]
        assert cls.description and cls.source and cls.level in (None, *tasks.LEVELS)
        expected = (cls.description if name == cls.name else
                    f"{cls.description} (same task as {cls.name!r})")
        assert tasks.TASKS[name] == expected
        params = inspect.signature(cls.__init__).parameters
        defaults = {k: p.default for k, p in params.items() if k not in ("self", "seed")}
        spec = json.loads(json.dumps(tasks.spec(name)))
        assert spec["options"] == json.loads(json.dumps(defaults)) and spec["level"] == cls.level
        assert spec["names"] == list(cls.names) and spec["source"] == cls.source
    assert len(tasks.TASKS) == len(set(tasks.TASKS)) == len(ALL_NAMES)


@pytest.mark.parametrize("name", SIZED)
def test_every_task_makes_with_defaults_and_has_json_metadata(name):
    task = tasks.make(name)
    meta = json.loads(json.dumps(task.metadata()))
    assert meta["name"] == name and meta["level"] == task.level and meta["source"] == task.source
    assert meta["vocab_size"] == task.vocab_size and meta["size_law"].startswith("seq_len(n) = ")
    assert task.options() == tasks.spec(name)["options"]  # defaults are what the task was made with
    assert tasks.make(name, **task.options()).metadata() == meta
    if task.symbols:
        assert task.vocab_size == tasks.NUM_SPECIAL + len(task.symbols) == tasks.NUM_SPECIAL + len(set(task.symbols))


def test_aliases_are_the_same_task_under_another_name():
    parity, check_ = tasks.make("parity"), tasks.make("parity_check")
    assert type(parity) is type(check_) and check_.name == "parity_check" and parity.name == "parity"
    assert check_.metadata()["task"] == "parity" and check_.metadata()["name"] == "parity_check"
    a, b = parity.batch(jax.random.key(3), 4, 16), check_.batch(jax.random.key(3), 4, 16)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])


def test_with_options_keeps_name_and_seed_and_sweep_is_empty_without_eval_sweep():
    copy = tasks.make("copy", seed=3, alphabet=5)
    other = copy.with_options(alphabet=7)
    assert (other.name, other.seed, other.alphabet) == ("copy", 3, 7) and copy.alphabet == 5
    assert copy.sweep() == [] and tasks.make("reverse_string").with_options().alphabet == 2
    with pytest.raises(ValueError, match="unknown option 'depth' for task 'copy'"):
        copy.with_options(depth=0.5)


def test_a_new_class_is_a_new_task_and_bad_declarations_are_refused():
    class Majority(Task):
        """majority: BOS bits SEP the more frequent bit (odd n)."""

        names = ("majority_example",)
        description = "BOS bits SEP majority bit"
        source = "a test of the registry"
        level = "R"
        symbols = ("0", "1")
        per_size, overhead = 1, 3

        def __init__(self, *, ties: str = "one", seed: int = 0):
            self.ties = ties
            super().__init__(seed=seed)

        def _bounds(self, max_n):
            return [2] * max_n

        def _example(self, draws, n, max_n, width):
            ones = jnp.sum(jnp.where(jnp.arange(max_n) < n, draws, 0))
            return compose(width, (tasks.BOS, 1, False), (tasks.FIRST_SYMBOL + draws, n, False),
                           (tasks.SEP, 1, False), (tasks.FIRST_SYMBOL + (2 * ones >= n), 1, True))

    try:
        assert tasks.TASKS["majority_example"] == "BOS bits SEP majority bit"
        assert tasks.spec("majority_example")["options"] == {"ties": "one"}
        task = tasks.make("majority_example", seed=1)
        seq, mask = full(task.batch(jax.random.key(0), 8, 12, split="eval"))
        for row, m in zip(seq, mask):
            bits = row[1:11] - tasks.FIRST_SYMBOL
            assert row[12] - tasks.FIRST_SYMBOL == int(2 * bits.sum() >= 10) and m.tolist() == [0] * 12 + [1]
        with pytest.raises(ValueError, match="unknown option 'tie' for task 'majority_example'; choose from: ties"):
            tasks.make("majority_example", tie="zero")
    finally:
        registry._REGISTRY.pop("majority_example")
    assert "majority_example" not in tasks.TASKS

    def declare(**attrs):
        return type("Broken", (Task,), {"__init__": lambda self, *, seed=0: None, **attrs})

    with pytest.raises(TypeError, match="task name 'copy' is declared by both Copy and Broken"):
        declare(names=("copy",), description="x", source="y")
    with pytest.raises(TypeError, match="must declare its own source"):
        declare(names=("broken_example",), description="x")
    with pytest.raises(TypeError, match="level 'cs'"):
        declare(names=("broken_example",), description="x", source="y", level="cs")
    with pytest.raises(TypeError, match="eval_sweep\\['depth'\\] must be a non-empty tuple"):
        declare(names=("broken_example",), description="x", source="y", eval_sweep={"depth": (0.5,)})
    with pytest.raises(TypeError, match="names must be a tuple of names"):
        declare(names="broken_example", description="x", source="y")
    assert "broken_example" not in tasks.TASKS
    with pytest.raises(TypeError, match="task name 'copy' is declared by both"):
        declare(names=("broken_example", "copy"), description="x", source="y")
    assert "broken_example" not in tasks.TASKS  # no name of a refused class is registered
