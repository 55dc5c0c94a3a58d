"""Kazemnejad et al. tasks, recall / state tracking and passkey: format, answers, determinism, 4x sizes.

Solvers parse each row by the documented format and recompute it in plain
Python; the reference computations of the official code are transcribed
with comments naming repository, file and function.
"""

import re

import jax
import numpy as np
import pytest
from task_checks import check_batch, check_task, sequences

import posenc.tasks as tasks
from posenc.tasks import BOS, EOS, FIRST_SYMBOL, SEP, passkey

LENGTH = 30


def names(task, ids):
    return [task.symbols[t - FIRST_SYMBOL] for t in ids]


def split(row):
    assert row[0] == BOS
    s = row.index(SEP)
    return row[1:s], s


def one_answer(task, row, symbol):
    problem, s = split(row)
    return [BOS, *problem, SEP, task.token(symbol)], [s + 1]


# ------------------------------------------------------------ Kazemnejad et al.
def solve_polynomial(task, row):
    problem, _ = split(row)
    items = names(task, problem)
    assert items[:2] == ["x", "="] and items[3] == ":"
    x = int(items[2])
    terms = [items[4 + 4 * i: 7 + 4 * i] for i in range((len(items) - 3) // 4)]
    assert all(items[7 + 4 * i] == "+" for i in range(len(terms) - 1)) and 4 * len(terms) + 3 == len(items)
    coeffs, degrees = [int(c) for c, _, _ in terms], [int(d) for _, _, d in terms]
    assert all(t[1] == "x" for t in terms) and -2 <= x <= 2
    assert all(-3 <= c <= 3 for c in coeffs) and all(0 <= d <= 3 for d in degrees)
    # McGill-NLP/length-generalization scripts/dataset_builders/make_poly_dataset.py generate_data (modular)
    ans = sum([coeffs[i] * x ** degrees[i] for i in range(len(terms))])
    ans = ans % 10
    return (len(terms), *one_answer(task, row, str(ans)))


def solve_summation(task, row):
    problem, _ = split(row)
    values = [int(v) for v in names(task, problem)]
    assert all(1 <= v <= 9 for v in values)
    answer = sum(values) % 10  # make_sum_dataset.py generate_data (modular)
    return (len(values), *one_answer(task, row, str(answer)))


def lego_clauses(variables, values):
    """make_lego_dataset.py generate_data: the clauses of a chain (NICE_VALUES = ["-1", "+1"])."""
    nice_values = ["-1", "+1"]
    clauses = [f"{variables[0]} = {nice_values[values[0]]}"]
    for i in range(1, len(variables)):
        modifier = "+" if values[i] == values[i - 1] else "-"
        clauses.append(f"{variables[i]} = {modifier} {variables[i - 1]}")
    return clauses


def solve_lego(task, row):
    problem, s = split(row)
    items = names(task, problem)
    assert items[-2] == "?"
    body, query = items[:-2], items[-1]
    clauses = [body[5 * i: 5 * i + 4] for i in range((len(body) + 1) // 5)]
    assert 5 * len(clauses) - 1 == len(body) and all(body[5 * i + 4] == "," for i in range(len(clauses) - 1))
    n = len(clauses)
    by_name = {c[0]: c for c in clauses}
    assert len(by_name) == n and all(c[1] == "=" and c[2] in "+-" for c in clauses)
    # Resolve the chain from its root (the clause "= +-1") outwards.
    (root,) = [c for c in clauses if c[3] == "1"]
    chain, values = [root[0]], [1 if root[2] == "+" else 0]
    following = {c[3]: c for c in clauses if c[3] != "1"}
    while chain[-1] in following:
        c = following.pop(chain[-1])
        chain.append(c[0])
        values.append(values[-1] if c[2] == "+" else 1 - values[-1])
    assert len(chain) == n and not following
    given = [" ".join([c[0], "=", c[2] + c[3] if c[3] == "1" else f"{c[2]} {c[3]}"]) for c in clauses]
    expected = lego_clauses(chain, values)
    assert (given == expected) if not task.permute else sorted(given) == sorted(expected)
    q = chain.index(query)
    assert (n + 1) // 2 <= q <= n - 1  # min_var_idx .. num_variables - 1
    answer = "+" if values[q] == 1 else "-"
    return n, [BOS, *problem, SEP, task.token(answer)], [s + 1]


def solve_count(task, row):
    problem, s = split(row)
    items = names(task, problem)
    n = len(items)
    assert all(c.isalpha() for c in items)
    if task.kind == "single_char":
        assert len(set(items)) == 1
    if task.modular:
        return (n, *one_answer(task, row, str(n % 10)))
    tokens = [BOS, *problem, SEP, *(task.token(d) for d in str(n)), EOS]
    return n, tokens, list(range(s + 1, len(tokens)))


# ------------------------------------------------------- recall and state tracking
def solve_mqar(task, row):
    """Rows without random filler (``random_non_queries=False``): every non-query slot is ``_ _``."""
    problem, s = split(row)
    context = names(task, problem)
    keys, vals = context[0::2], context[1::2]
    n = len(keys)
    assert all(k[0] == "k" for k in keys) and all(v[0] == "v" for v in vals) and len(context) == 2 * n
    assert len(set(keys)) == n and len(set(vals)) == n  # np.random.choice(..., replace=False)
    region = names(task, row[s + 1: s + 1 + 2 * task.slots * n])
    lookup = dict(zip(keys, vals))
    answers, queried = [], []
    for g in range(task.slots * n):
        first, second = region[2 * g: 2 * g + 2]
        if first == "_":
            assert second == "_"
            continue
        assert second == lookup[first]
        queried.append(first)
        answers.append(s + 1 + 2 * g + 1)
    assert sorted(queried) == sorted(keys)  # each key queried exactly once
    return n, row[: s + 1 + 2 * task.slots * n], answers


def solve_flip_flop(task, row):
    assert row[0] == BOS
    end = max(i for i, t in enumerate(row) if t != 0) + 1  # symbols are never PAD
    items = names(task, row[1:end])
    n = len(items) // 2
    instr, data = items[0::2], [int(b) for b in items[1::2]]
    assert instr[0] == "w" and instr[-1] == "r" and set(instr) <= {"w", "r", "i"}
    answers, last = [], None
    for i, (op, bit) in enumerate(zip(instr, data)):
        if op == "w":
            last = bit
        elif op == "r":
            assert bit == last  # a read returns the most recent write
            answers.append(2 + 2 * i)
    return n, row[:end], answers


def solve_induction(task, row):
    problem, s = split(row)
    x = [int(v) for v in names(task, problem)]
    query, answer = int(names(task, [row[s + 1]])[0]), int(names(task, [row[s + 2]])[0])
    n = len(x)
    earlier = [i for i in range(n - 1) if x[i] == query]
    assert earlier  # the query occurs among the first n - 1 tokens
    assert answer == x[earlier[-1] + 1]  # the token after its previous occurrence
    return n, row[: s + 3], [s + 2]


def official_passkey_prompt(n_garbage_prefix, n_garbage_suffix, pass_key):
    """epfml/landmark-attention llama/run_test.py generate_prompt, with the random draws given."""
    task_description = ("There is an important info hidden inside a lot of irrelevant text. Find it and "
                        "memorize them. I will quiz you about the important information there.")
    garbage = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
    garbage_inf = " ".join([garbage] * 2000)
    assert len(garbage_inf) >= n_garbage_prefix + n_garbage_suffix
    garbage_prefix = garbage_inf[:n_garbage_prefix]
    garbage_suffix = garbage_inf[:n_garbage_suffix]
    information_line = f"The pass key is {pass_key}. Remember it. {pass_key} is the pass key."
    final_question = "What is the pass key? The pass key is"
    lines = [task_description, garbage_prefix, information_line, garbage_suffix, final_question]
    return "\n".join(lines)


PASSKEY_LINE = re.compile(r"\nThe pass key is (\d+)\. Remember it\. \1 is the pass key\.\n")


def parse_passkey(row):
    text = bytes(row).rstrip(b"\x00").decode("ascii")
    info = PASSKEY_LINE.search(text)
    key = int(info.group(1))
    start = len(passkey.DESCRIPTION) + 1
    prefix, suffix = info.start() - start, text.index("\nWhat is the pass key?") - info.end()
    return text, prefix, suffix, key


def solve_passkey(task, row):
    text, prefix, suffix, key = parse_passkey(row)
    assert 1 <= key <= 50000  # random.randint(1, 50000)
    expected = (official_passkey_prompt(prefix, suffix, key) + " " + str(key)).encode("ascii")
    assert text.encode("ascii") == expected
    k = len(str(key))
    return prefix + suffix, list(expected), list(range(len(expected) - k, len(expected)))


CASES = {
    "polynomial": ({}, solve_polynomial),
    "summation": ({}, solve_summation),
    "lego": ({}, solve_lego),
    "lego-permuted": ({"permute": True}, solve_lego),
    "count": ({}, solve_count),
    "count-single-exact": ({"kind": "single_char", "modular": False}, solve_count),
    "mqar": ({"random_non_queries": False, "keys": 20, "values": 20, "slots": 2}, solve_mqar),
    "flip_flop": ({}, solve_flip_flop),
    "induction": ({}, solve_induction),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_format_answers_determinism_and_4x_sizes(case):
    options, solve = CASES[case]
    task = tasks.make(case.split("-")[0], **options)
    check_task(task, solve, LENGTH)


def test_passkey_is_the_official_prompt_with_the_key_as_answer():
    task = tasks.make("passkey")
    assert task.vocab_size == 256 and task.min_length() == task.seq_len(0) - 1
    check_task(task, solve_passkey, task.min_length() + 40)


@pytest.mark.parametrize("keys", [5, 64])
def test_mqar_with_random_filler_queries_each_key_once(keys):
    task = tasks.make("mqar", keys=keys, values=keys)
    seq, mask = sequences(task.batch(jax.random.key(3), 16, 120, split="eval"))
    n = task.max_size(120)
    assert n == min(keys, (120 + 1 - 2) // task.per_size)
    for row, m in zip(seq.tolist(), mask):
        context = names(task, row[1: 1 + 2 * n])
        lookup = dict(zip(context[0::2], context[1::2]))
        answers = [i for i in range(len(row)) if m[i]]
        assert sorted(names(task, [row[i - 1] for i in answers])) == sorted(lookup)
        assert all(names(task, [row[i]])[0] == lookup[names(task, [row[i - 1]])[0]] for i in answers)
        region = row[2 + 2 * n: 2 + 2 * n + 2 * task.slots * n]
        assert "_" not in names(task, region)  # filler is random keys and values


@pytest.mark.parametrize("power_a", [0.01, 1.0])
def test_mqar_first_query_gap_follows_zoologys_power_law(power_a):
    task = tasks.make("mqar", power_a=power_a, keys=8, values=8, random_non_queries=False)
    length, batch = 62, 600
    n = task.max_size(length)  # 6 pairs, 24 slots
    space = task.slots * n
    seq, _ = sequences(task.batch(jax.random.key(4), batch, length, split="eval"))
    first_gaps = []
    for row in seq.tolist():
        first_key = row[1]
        region = row[2 + 2 * n::2][:space]
        first_gaps.append(region.index(first_key))  # keys[0] is put at the first drawn gap
    # zoology/data/multiquery_ar.py multiquery_ar: the distribution of one gap draw
    p = power_a * np.arange(1, space + 1) ** (power_a - 1)
    p = p / p.sum()
    g = np.arange(space)
    mean = (g * p).sum()
    sd = np.sqrt((g**2 * p).sum() - mean**2)
    assert abs(np.mean(first_gaps) - mean) < 4 * sd / np.sqrt(batch)
    if power_a < 1:
        assert np.mean(np.array(first_gaps) == 0) > 0.15  # the power law favours the first slot


def test_flip_flop_sweep_covers_dense_in_distribution_and_sparse():
    task = tasks.make("flip_flop")
    points = task.sweep()
    assert [(o, v) for o, v, _ in points] == [("p_ignore", 0.1), ("p_ignore", 0.8), ("p_ignore", 0.98)]
    for _, p, point in points:
        assert point.p_ignore == p and point.metadata()["p_ignore"] == p
        seq, _ = sequences(point.batch(jax.random.key(5), 40, 200, split="eval"))
        instr = np.array([names(point, row[1::2][:100]) for row in seq.tolist()])[:, 1:-1]
        freq_i, freq_w, freq_r = ((instr == c).mean() for c in "iwr")
        sd = np.sqrt(p * (1 - p) / instr.size)
        assert abs(freq_i - p) < 5 * sd + 1e-3
        assert abs(freq_w - freq_r) < 0.04  # writes and reads share the rest equally


def test_passkey_depth_sweep_places_the_key_at_each_depth():
    task = tasks.make("passkey")
    assert task.eval_sweep == {"depth": (0.0, 0.25, 0.5, 0.75, 1.0)} and task.depth is None
    length = task.min_length() + 100
    n = task.max_size(length)
    for option, depth, point in task.sweep():
        assert option == "depth" and point.depth == depth and point.seed == task.seed
        batch = point.batch(jax.random.key(6), 4, length, split="eval")
        check_batch(point, batch, length, solve_passkey)
        for row in sequences(batch)[0].tolist():
            _, prefix, suffix, _ = parse_passkey(row)
            assert prefix + suffix == n and prefix == round(depth * n)


def test_passkey_training_depth_is_uniform():
    task = tasks.make("passkey")
    length = task.min_length() + 20
    n = task.max_size(length)
    seq, _ = sequences(task.batch(jax.random.key(8), 200, length, split="eval"))
    prefixes = [parse_passkey(row)[1] for row in seq.tolist()]
    assert min(prefixes) <= 2 and max(prefixes) >= n - 2  # random.randint(0, n_garbage)
    assert abs(np.mean(prefixes) - n / 2) < 4 * np.sqrt((n + 1) ** 2 / 12 / 200)


@pytest.mark.parametrize("name,options,error", [
    ("passkey", {"depth": 1.5}, "depth must be a finite number >= 0.0 <= 1.0; got 1.5"),
    ("flip_flop", {"p_ignore": -0.1}, "p_ignore must be a finite number >= 0.0 <= 1.0; got -0.1"),
    ("mqar", {"power_a": 0.0}, "power_a must be a finite number > 0"),
    ("count", {"kind": "pairs"}, "unknown kind 'pairs'; choose one of: multi_char, single_char"),
    ("lego", {"variables": 1}, "variables must be an integer >= 2; got 1"),
])
def test_bad_options_name_the_value_and_the_allowed_ones(name, options, error):
    with pytest.raises(ValueError, match=re.escape(error)):
        tasks.make(name, **options)


def test_size_caps_and_smallest_sizes():
    assert tasks.make("lego").max_size(1000) == 26 and tasks.make("lego", variables=40).max_size(1000) == 40
    assert tasks.make("mqar", keys=6, values=9).max_size(1000) == 6
    for name, smallest in (("lego", 2), ("flip_flop", 2), ("induction", 2), ("passkey", 0), ("count", 1)):
        task = tasks.make(name)
        assert task.smallest == smallest and task.min_length() == task.seq_len(smallest) - 1
    count = tasks.make("count", modular=False)
    assert [count.seq_len(n) for n in (9, 10, 99, 100)] == [13, 15, 104, 106]  # n + len(str(n)) + 3
    assert [count.max_size(length) for length in (12, 13, 14, 15)] == [9, 9, 10, 11]

