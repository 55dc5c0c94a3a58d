"""Arithmetic tasks: every format against an independent solver, the papers' builders, index hints.

The solvers parse a row by the documented format and recompute it with
Python integers; the answer strings of the scratchpads come from the
official builders of HanseulJo/position-coupling (``src/data/addition.py``
``generate_scratchpad_multiple_addition``, ``src/data/multiplication.py``
``generate_scratchpad_multiplication``), transcribed below. Coupled position
ids are checked against the official code in tests/test_position_coupling.py.
"""

import jax
import numpy as np
import pytest
import task_checks

import posenc.tasks as tasks
from posenc.tasks import BOS, EOS, FIRST_SYMBOL, SEP
from posenc.tasks.arithmetic import GREATER, PLUS

LENGTH = 32


# ------------------------------------------------------- transcribed official builders


def kazemnejad_range(digits):
    """``make_addition_dataset.generate_data_for_bin``: an operand of d digits is randint(low, 10**d)."""
    low = 10 ** (digits - 1)
    return (0 if low == 1 else low), 10 ** digits  # [low, high)


def scratchpad_multiple_addition(numbers, reversed_num=True, reversed_order=False, pad_len=0,
                                 start_with_zeros=False):
    """``generate_scratchpad_multiple_addition`` (src/data/addition.py)."""
    if len(numbers) < 1:
        return ""
    cum_sums = [0]
    for num in numbers[::-1 if reversed_order else 1]:
        cum_sums.append(cum_sums[-1] + num)
    if not start_with_zeros:
        cum_sums = cum_sums[1:]
    cum_sums_str = ['P' * max(0, pad_len - len(csum)) + csum for csum in map(str, cum_sums)]
    if reversed_num:
        cum_sums_str = [x[::-1] for x in cum_sums_str]
    return '>'.join(cum_sums_str)


def scratchpad_multiplication(numbers, reversed_num=True, pad_len=(0, 0)):
    """``generate_scratchpad_multiplication`` (src/data/multiplication.py), pad_len a pair."""
    A, B = numbers
    pad_len_1, pad_len_2 = pad_len
    pad_len_1 = max(len(str(A)), pad_len_1)
    pad_len_2 = max(len(str(A)), pad_len_2)
    B_list = list(map(int, str(B)))[::-1]
    nby1_decomp = [A * b for b in B_list]
    nby1_decomp_str = ['P' * max(0, pad_len_1 - len(comp)) + comp for comp in map(str, nby1_decomp)]
    if reversed_num:
        nby1_decomp_str = [x[::-1] for x in nby1_decomp_str]
    scratchpad = '+'.join(nby1_decomp_str) + '='
    cum_sums = [0]
    mul_10 = 1
    for num in nby1_decomp:
        cum_sums.append(cum_sums[-1] + num * mul_10)
        mul_10 *= 10
    cum_sums_str = ['P' * max(0, pad_len_2 - len(csum)) + csum for csum in map(str, cum_sums[1:])]
    if reversed_num:
        cum_sums_str = [x[::-1] for x in cum_sums_str]
    return scratchpad + '>'.join(cum_sums_str)


# ------------------------------------------------------------------------- solvers


def _text(task, ids):
    """Token ids as the official strings: digits, '+', '*', '>' and '=' for SEP."""
    names = {SEP: "="}
    return "".join(names.get(t) or task.symbols[t - FIRST_SYMBOL] for t in ids)


def _ids(task, text):
    """The inverse of :func:`_text` ('P' padding is the digit 0, as the official pad_token '0')."""
    return [SEP if ch == "=" else FIRST_SYMBOL + task.symbols.index("0" if ch == "P" else ch) for ch in text]


def _split(row, start, stop_token):
    end = row.index(stop_token, start)
    return row[start:end], end


def _check_number(text, *, padded):
    """A written number (most significant first): no leading zero unless padded or a single digit."""
    assert text.isdigit() and (padded or len(text) == 1 or text[0] != "0"), text
    return int(text)


def solve_addition(task, row):
    assert row[0] == BOS
    a_tok, p = _split(row, 1, PLUS)
    b_tok, s = _split(row, p + 1, SEP)
    c_tok, e = _split(row, s + 1, EOS)
    hints = {}
    if task.index_hints:  # hint, digit pairs: check the hints follow significance from one offset
        for name, toks in (("a", a_tok), ("b", b_tok)):
            assert all(t >= FIRST_SYMBOL + 11 for t in toks[0::2]), (name, toks)
            hints[name] = [t - FIRST_SYMBOL - 11 for t in toks[0::2]]
        a_tok, b_tok = a_tok[1::2], b_tok[1::2]
    rev_in, rev_out = task.format == "reversed", task.format != "msd"
    padded = task.zero_pad or task.format == "reversed_padded"
    a_text, b_text = (_text(task, t)[::-1 if rev_in else 1] for t in (a_tok, b_tok))
    a, b = _check_number(a_text, padded=padded), _check_number(b_text, padded=padded)
    n = max(len(a_text), len(b_text))
    if padded:
        assert len(a_text) == len(b_text) == n
        if task.format != "reversed_padded":  # the longer operand has n significant digits
            assert max(len(str(a)), len(str(b))) == n
    else:  # Kazemnejad et al.'s bins: d digits uniform over [low, 10^d)
        for text, v in ((a_text, a), (b_text, b)):
            lo, hi = kazemnejad_range(len(text))
            assert lo <= v < hi
    c_text = str(a + b).zfill(n + 1) if padded else str(a + b)
    c_text = c_text[::-1] if rev_out else c_text
    c_ids = _ids(task, c_text)
    if task.index_hints:
        o = hints["a"][-1 if not rev_in else 0]  # the units digit's hint is the offset
        sig = range(len(c_text)) if rev_out else range(len(c_text) - 1, -1, -1)
        hint = [FIRST_SYMBOL + 11 + (o + s_) % task.hints for s_ in sig]
        c_ids = [t for pair in zip(hint, c_ids) for t in pair]
        for name, text in (("a", a_text), ("b", b_text)):
            sig = range(len(text)) if rev_in else range(len(text) - 1, -1, -1)
            assert hints[name] == [(o + s_) % task.hints for s_ in sig]
    tokens = row[:s + 1] + c_ids + [EOS]
    return n, tokens, list(range(s + 1, s + 2 + len(c_ids)))


def solve_multi_addition(task, row):
    assert row[0] == BOS
    problem, s = _split(row, 1, SEP)
    texts = _text(task, problem).split("+")
    numbers = [_check_number(t, padded=True) for t in texts]
    k, w = len(numbers), len(texts[0])
    n = w - 1
    assert task.min_operands <= k <= task.operands and all(len(t) == w for t in texts)
    assert max(len(str(v)) for v in numbers) == n  # one operand of n digits ("uniform_fixed_max")
    overflow = len(str(int("9" * n) * k))  # the official padding width
    assert overflow == w
    if task.scratchpad:
        labels = scratchpad_multiple_addition(numbers, reversed_num=True, pad_len=overflow,
                                              start_with_zeros=True)
    else:
        labels = ("P" * (overflow - len(str(sum(numbers)))) + str(sum(numbers)))[::-1]
    ids = [GREATER if ch == ">" else t for ch, t in zip(labels, _ids(task, labels.replace(">", "0")))]
    tokens = row[:s + 1] + ids + [EOS]
    return n, tokens, list(range(s + 1, s + 2 + len(ids)))


def solve_multiplication(task, row):
    assert row[0] == BOS
    times = FIRST_SYMBOL + task.symbols.index("*")
    a_tok, t = _split(row, 1, times)
    b_tok, s = _split(row, t + 1, SEP)
    a_text, b_text = _text(task, a_tok), _text(task, b_tok)
    a = _check_number(a_text, padded=False)
    n = len(a_text)
    if task.scratchpad:
        b = _check_number(b_text, padded=False)
        assert 1 <= len(b_text) <= task.second
        labels = scratchpad_multiplication([a, b], reversed_num=True, pad_len=(n + 1, n + len(b_text)))
    else:
        b = _check_number(b_text, padded=True)
        assert len(b_text) == task.second  # f"{b:0{M}d}"
        result = str(a * b)
        labels = ("P" * (n + task.second - len(result)) + result)[::-1]
    special = {ch: FIRST_SYMBOL + task.symbols.index(ch) for ch in "+>"}
    ids = [special.get(ch, t) for ch, t in zip(labels, _ids(task, labels.replace(">", "0").replace("+", "0")))]
    tokens = row[:s + 1] + ids + [EOS]
    return n, tokens, list(range(s + 1, s + 2 + len(ids)))


SOLVERS = {"addition": solve_addition, "multi_addition": solve_multi_addition,
           "multiplication": solve_multiplication}

CASES = [
    ("addition", {}),
    ("addition", {"format": "reversed_output"}),
    ("addition", {"format": "reversed"}),
    ("addition", {"format": "reversed_padded"}),
    ("addition", {"format": "reversed_output", "zero_pad": True}),
    ("addition", {"format": "msd", "zero_pad": True}),
    ("addition", {"format": "reversed", "index_hints": True, "hints": 7}),
    ("addition", {"format": "msd", "index_hints": True}),
    ("addition", {"format": "reversed_output", "zero_pad": True, "coupled": True, "max_position": 60}),
    ("multi_addition", {}),
    ("multi_addition", {"operands": 4, "scratchpad": True}),
    ("multi_addition", {"scratchpad": True, "coupled": True, "max_position": 40, "max_position_operands": 6}),
    ("multiplication", {}),
    ("multiplication", {"second": 3, "coupled": True, "max_position": 60}),
    ("multiplication", {"scratchpad": True}),
    ("multiplication", {"scratchpad": True, "second": 3, "coupled": True, "max_position": 60,
                        "max_position_operands": 5}),
]
IDS = [f"{n}-{'-'.join(f'{k}{v}' for k, v in o.items()) or 'default'}" for n, o in CASES]


@pytest.mark.parametrize("name,options", CASES, ids=IDS)
def test_rows_match_the_solver_at_train_and_eval_sizes(name, options):
    task = tasks.make(name, **options)
    length = max(LENGTH, task.seq_len(3) - 1)  # sizes 1 .. 3 at least
    factor = 4 if task.seq_len(1) < 30 else 2
    train, evaluation = task_checks.check_task(task, SOLVERS[name], length, factor=factor)
    assert ("position_ids" in train) == (task.position_levels > 0)
    if "position_ids" in train:
        assert train["position_ids"].shape == train["inputs"].shape
        assert train["position_ids"].dtype == np.int32


def test_reversed_padded_is_the_earlier_addition():
    """The earlier default (equal n-digit operands, leading zeros, sum reversed with n + 1 digits)."""
    task = tasks.make("addition", format="reversed_padded")
    seq, _ = task_checks.sequences(task.batch(jax.random.key(0), 64, 22, split="eval"))
    n = task.max_size(22)
    assert n == 6 and seq.shape[1] == 3 * n + 5
    assert np.all(seq[:, n + 1] == PLUS) and np.all(seq[:, 2 * n + 2] == SEP) and np.all(seq[:, -1] == EOS)
    lead = seq[:, 1] - FIRST_SYMBOL
    assert (lead == 0).any()  # leading zeros are drawn (uniform digits)


def test_operand_lengths_are_independent_and_the_longer_has_n_digits():
    task = tasks.make("addition")
    seq, _ = task_checks.sequences(task.batch(jax.random.key(1), 256, 32, split="eval"))
    n = task.max_size(32)
    pairs = set()
    for row in seq.tolist():
        p, s = row.index(PLUS), row.index(SEP)
        pairs.add((p - 1, s - p - 1))
    assert all(max(x) == n for x in pairs)
    assert {x for x, y in pairs} == set(range(1, n + 1)) and {y for x, y in pairs} == set(range(1, n + 1))


def pick_char_set(max_len, start, set_of_chars):
    """``create_data_split.pick_char_set`` of mcleish7/arithmetic with its random start passed in."""
    if start + max_len > len(set_of_chars):  # i.e. cycle round
        return set_of_chars[start:len(set_of_chars)] + set_of_chars[:start + max_len - len(set_of_chars)]
    return set_of_chars[start:start + max_len]


def hints_helper(num_str, chars):
    """``create_data_split.hints_helper``: each character of the number after its hint."""
    return [x for char, digit in zip(chars, num_str) for x in (char, digit)]


def test_index_hints_of_the_reversed_format_are_mcleish_et_al_s():
    # bucket_method_gen with reverse_all and index_hints: one cyclic run of hints from a random start,
    # max_len = the longest of a, b and c, applied to each reversed number from its first character.
    task = tasks.make("addition", format="reversed", index_hints=True, hints=7)
    hint_names = list(task.symbols[11:])
    for split in ("train", "eval"):
        seq, _ = task_checks.sequences(task.batch(jax.random.key(4), 32, 40, split=split))
        for row in seq.tolist():
            p, s, e = row.index(PLUS), row.index(SEP), row.index(EOS)
            parts = [row[1:p], row[p + 1:s], row[s + 1:e]]
            nums = [[task.symbols[t - FIRST_SYMBOL] for t in part[1::2]] for part in parts]
            start = hint_names.index(task.symbols[parts[0][0] - FIRST_SYMBOL])
            assert start == 0 or split == "train"
            chars = pick_char_set(max(map(len, nums)), start, hint_names)
            for part, num in zip(parts, nums):
                assert [task.symbols[t - FIRST_SYMBOL] for t in part] == hints_helper(num, chars)


def test_index_hints_offset_is_random_at_training_and_zero_at_evaluation():
    task = tasks.make("addition", format="reversed", index_hints=True, hints=11)
    first_hint = lambda b: set((np.asarray(b["inputs"])[:, 1] - FIRST_SYMBOL - 11).tolist())  # noqa: E731
    assert first_hint(task.batch(jax.random.key(0), 64, 40, split="eval")) == {0}  # a's units digit
    assert len(first_hint(task.batch(jax.random.key(0), 64, 40))) > 5
    assert task.vocab_size == 4 + 11 + 11 and task.symbols[11:] == tuple(f"h{i}" for i in range(11))


@pytest.mark.parametrize("name,options,message", [
    ("addition", {"format": "lsd"}, "unknown format 'lsd'"),
    ("addition", {"coupled": True, "index_hints": True}, "coupled=True and index_hints=True"),
    ("addition", {"format": "reversed_padded", "zero_pad": True}, "zero-padded already"),
    ("addition", {"hints": 5}, "option hints=5 of task 'addition' needs index_hints=True"),
    ("addition", {"max_position": 5}, "option max_position=5 of task 'addition' needs coupled=True"),
    ("multi_addition", {"operands": 11}, "operands must be an integer in \\[2, 10\\]; got 11"),
    ("multi_addition", {"operands": 3, "min_operands": 4}, "min_operands must be an integer in \\[2, 3\\]"),
    ("multi_addition", {"coupled": True, "max_position_operands": 3},
     "max_position_operands=3 of task 'multi_addition' needs coupled=True and scratchpad=True"),
    ("multiplication", {"second": 0}, "second must be an integer >= 1; got 0"),
    ("copy", {"max_position": 9}, "option max_position=9 of task 'copy' needs coupled=True"),
])
def test_bad_options_are_refused(name, options, message):
    with pytest.raises(ValueError, match=message):
        tasks.make(name, **options)


def test_a_max_position_too_small_for_the_training_sizes_is_refused():
    task = tasks.make("addition", format="reversed_output", zero_pad=True, coupled=True, max_position=9)
    with pytest.raises(ValueError, match="max_position 9 is too small for size-9 problems of task 'addition'.*"
                                         ">= 11"):
        task.batch(jax.random.key(0), 2, 32)
    task.batch(jax.random.key(0), 2, 32, split="eval")  # evaluation starts at 1: no offset to fit
    with pytest.raises(ValueError, match="max_position_operands 2 is too small"):
        tasks.make("multi_addition", scratchpad=True, coupled=True, max_position=40,
                   max_position_operands=2).batch(jax.random.key(0), 2, 40)


# ------------------------------------------------------------ no degenerate evaluation

# one case per task and kind of answer (formats differ only in the order of the same digits)
NON_DEGENERATE = [CASES[i] for i in (0, 3, 6, 8, 9, 11, 12, 15)] + [
    ("copy", {"coupled": True, "max_position": 40}), ("reverse", {"coupled": True, "max_position": 40}),
]


@pytest.mark.parametrize("name,options", NON_DEGENERATE,
                         ids=[f"{n}-{i}" for i, (n, _) in enumerate(NON_DEGENERATE)])
def test_evaluation_answers_vary_across_examples_at_every_length(name, options):
    task = tasks.make(name, **options)
    base = max(LENGTH, task.seq_len(3) - 1)
    for length in (base, 2 * base, 3 * base):
        batch = task.batch(jax.random.key(length), 16, length, split="eval")
        targets, mask = np.asarray(batch["targets"]), np.asarray(batch["mask"])
        answers = {tuple(t[m > 0].tolist()) for t, m in zip(targets, mask)}
        assert len(answers) >= 12, (name, length, len(answers))  # 16 examples, (almost) all different
        if "position_ids" in batch:  # coupled ids at evaluation start at 1 (no offset): ids vary by size
            assert np.asarray(batch["position_ids"]).max() > 1
