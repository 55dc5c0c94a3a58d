"""RULER tasks (byte level): every row against an independent solver, RULER's templates and counts, sweeps.

Each solver parses a generated row back by RULER's format (hsiehjackson/RULER scripts/data/synthetic/*.py and
constants.py, whose templates are written out here again), checks the structure RULER's generator produces,
recomputes the answer from the parsed problem and returns (size, expected bytes, answer positions).
"""

import collections
import math
import re

import jax
import numpy as np
import pytest
from task_checks import check_batch, check_task, sequences

from posenc import tasks
from posenc.tasks import corpus as corpus_lib
from posenc.tasks import ruler_text

NIAH_TEMPLATE = ("Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. "
                 "I will quiz you about the {type_needle_v} afterwards.\n{context}\nWhat are all the special magic "
                 "{type_needle_v} for {query} mentioned in the provided text? The special magic {type_needle_v} for "
                 "{query} mentioned in the provided text are")
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
PATTERNS = {"words": r"[a-z]+-[a-z]+", "numbers": r"[1-9]\d{6}",
            "uuids": r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"}
GRID = [int(round(x)) for x in np.linspace(0, 100, 40)]


def text_of(row):
    return bytes(row).rstrip(b"\x00").decode("latin-1")


def niah_prompt(task):
    """RULER's niah.py template handling: singular when num_needle_q * num_needle_v == 1."""
    template, type_needle_v = NIAH_TEMPLATE, task.value_type
    if task.queries * task.values == 1:
        template = template.replace("Some", "A").replace("are all", "is").replace("are", "is")
        type_needle_v = type_needle_v[:-1]
    return template.replace("{type_needle_v}", type_needle_v)


_ESSAY = {}


def essay_text():
    """The stdlib corpus's train split, NUL -> space, whitespace runs -> one space (RULER's re.sub)."""
    if "stdlib" not in _ESSAY:
        data = bytes(np.asarray(corpus_lib.load_corpus().data["train"], np.uint8)).replace(b"\x00", b" ")
        _ESSAY["stdlib"] = re.sub(rb"\s+", b" ", data).decode("latin-1")
    return _ESSAY["stdlib"]


def boundary(t, p):
    return p == 0 or p == len(t) or t[p - 1] == " "


def snap(t, goal):
    return next(p for p in range(goal, len(t) + 1) if boundary(t, p))


def solve_niah(task, row):
    text = text_of(row)
    prompt = niah_prompt(task)
    prefix, rest = prompt.split("{context}")
    question, answer_prefix, tail = rest.split("{query}")
    assert text.startswith(prefix)
    q_at = text.index(question, len(prefix))
    context = text[len(prefix):q_at]
    query, after = text[q_at + len(question):].split(answer_prefix, 1)
    query_again, answer = after.split(tail + " ", 1)
    assert query == query_again
    queries = query.split(", and ")
    queries = queries[0].split(", ") + queries[1:] if len(queries) == 2 else queries
    assert len(queries) == task.queries == len(set(queries))
    needle = (rf"One of the special magic {task.value_type} for ({PATTERNS[task.key_type]}) is: "
              rf"({PATTERNS[task.value_type]})\.")
    k_total = max(task.keys, task.queries)  # RULER: num_needle_k = max(num_needle_k, num_needle_q)
    if task.haystack == "essay":
        spans = list(re.finditer(needle, context))
        needles = [(m.group(1), m.group(2)) for m in spans]
        # undo the insertions: "needle " before a word, " needle" after the last byte
        pieces, at, cut = [], [], 0
        end_run = len(context)
        for m in reversed(spans):  # needles at the very end are preceded by a space
            if m.end() == end_run:
                end_run = m.start() - 1
                assert context[end_run] == " "
        for m in spans:
            if m.start() > end_run:
                pieces.append(context[cut:m.start() - 1])
                cut = m.end()
            else:
                assert context[m.end()] == " "
                pieces.append(context[cut:m.start()])
                cut = m.end() + 1
            at.append(sum(len(p) for p in pieces))
        pieces.append(context[cut:])
        hay = "".join(pieces)
        n = len(hay)
        rebuilt, last = "", 0
        for (key, value), p in zip(needles, at):
            text_n = f"One of the special magic {task.value_type} for {key} is: {value}."
            rebuilt += hay[last:p] + (" " + text_n if p == n else text_n + " ")
            last = p
        assert rebuilt + hay[last:] == context
        if n:
            # a window of the corpus at a word start (text can repeat: any of its occurrences)
            found = [m.start() for m in re.finditer(re.escape(hay), essay_text())]
            assert any(f == 0 or essay_text()[f - 1] == " " for f in found), found[:5]
        for p in at:  # each needle at a word boundary reached from RULER's depth grid
            assert boundary(hay, p)
            assert any(snap(hay, int(n * g / 100)) == p for g in GRID) or task.depth is not None
        lines_ok = True
    else:
        lines = context.split("\n")
        parsed = [re.fullmatch(needle, line) for line in lines]
        if task.haystack == "noise":
            assert all(m is not None or line == FILLER for m, line in zip(parsed, lines))
            n = lines.count(FILLER)
            flags = [m is not None for m in parsed]
            assert not any(a and b for a, b in zip(flags, flags[1:]))  # distinct sentence slots
            assert task.depth is not None or not flags[-1]  # random.sample(range(n)): never after the last
        else:
            assert all(m is not None for m in parsed)
            n = len(lines) - k_total * task.values
        needles = [(m.group(1), m.group(2)) for m in parsed if m is not None]
        lines_ok = True
    assert lines_ok
    by_key = collections.defaultdict(list)
    for key, value in needles:
        by_key[key].append(value)
    if task.haystack != "needle":
        assert len(needles) == k_total * task.values and len(by_key) == k_total
    assert all(len(by_key[q]) == task.values for q in queries)  # distractors never repeat a needle's key
    expected_answer = ", ".join(v for q in queries for v in by_key[q])
    assert answer == expected_answer
    full = (prefix + context + question + query + answer_prefix + query + tail + " " + expected_answer).encode(
        "latin-1")
    return n, list(full), list(range(len(full) - len(expected_answer), len(full)))


def check_rows(task, solve, extra, **kw):
    """check_task at min_length + extra and twice that, and no two examples of a batch share an answer."""
    batches = check_task(task, solve, task.min_length() + extra, factor=2, batch_size=6, **kw)
    for batch in batches:  # the training and the evaluation length: no degenerate batch
        seq, mask = sequences(batch)
        answers = {bytes(row[m > 0].tolist()) for row, m in zip(seq, mask)}
        assert len(answers) == len(seq), answers


NIAH_CASES = {  # RULER's settings (scripts/synthetic.yaml) and the other key / value types and haystacks
    "single-noise": ("niah_single", {}),  # niah_single_1
    "single-essay-uuids": ("niah_single", {"haystack": "essay", "value_type": "uuids"}),  # niah_single_3
    "multikey-essay": ("niah_multikey", {}),  # niah_multikey_1
    "multikey-needle": ("niah_multikey", {"haystack": "needle", "keys": 1}),  # niah_multikey_2
    "multikey-needle-uuids": ("niah_multikey", {"haystack": "needle", "keys": 1, "key_type": "uuids",
                                                "value_type": "uuids"}),  # niah_multikey_3
    "multivalue-noise-words": ("niah_multivalue", {"haystack": "noise", "value_type": "words"}),
    "multiquery-essay": ("niah_multiquery", {}),  # niah_multiquery
    "multiquery-noise-numbers": ("niah_multiquery", {"haystack": "noise", "key_type": "numbers"}),
}


@pytest.mark.parametrize("case", sorted(NIAH_CASES))
def test_niah_rows_match_the_solver(case):
    name, options = NIAH_CASES[case]
    task = tasks.make(name, **options)
    assert task.vocab_size == 256
    check_rows(task, solve_niah, 300)


def test_niah_ruler_settings_and_sweeps():
    single, multikey = tasks.make("niah_single"), tasks.make("niah_multikey")
    assert (single.haystack, single.keys, single.values, single.queries) == ("noise", 1, 1, 1)  # niah_single_1
    assert (multikey.haystack, multikey.keys) == ("essay", 4)  # niah_multikey_1
    assert tasks.make("niah_multivalue").values == 4 and tasks.make("niah_multiquery").queries == 4
    assert single.eval_sweep == {"depth": (0.0, 0.25, 0.5, 0.75, 1.0)}
    assert multikey.eval_sweep["keys"] == (1, 2, 4, 8)
    assert GRID[:4] == [0, 3, 5, 8] and GRID[-1] == 100 and len(GRID) == 40


@pytest.mark.parametrize("haystack", ["noise", "essay"])
def test_niah_depth_sweep_places_the_asked_needle(haystack):
    task = tasks.make("niah_single", haystack=haystack)
    length = task.min_length() + 500
    n = task.max_size(length)
    assert [(o, v) for o, v, _ in task.sweep()] == [("depth", v) for v in (0.0, 0.25, 0.5, 0.75, 1.0)]
    for depth in (0.0, 0.5, 1.0):
        point = task.with_options(depth=depth)
        batch = point.batch(jax.random.key(3), 4, length, split="eval")
        check_batch(point, batch, length, solve_niah)
        for row in sequences(batch)[0].tolist():
            text = text_of(row)
            context = text[len(niah_prompt(point).split("{context}")[0]):text.index("\nWhat is")]
            if haystack == "noise":
                lines = context.split("\n")
                slot = [i for i, line in enumerate(lines) if line != FILLER][0]
                assert slot == round(depth * n)  # before filler sentence round(depth * n)
            else:
                start = context.index("One of the special magic")
                hay = context[:start] + context[context.index(".", start + 40) + 2:]
                if depth == 1.0:
                    assert context.endswith(".") and start == len(context) - len(context[start:])
                else:
                    assert start == snap(hay[:n], int(n * depth))


def solve_vt(task, row):
    text = text_of(row)
    template = ("Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
                "Question: Find all variables that are assigned the value {query} in the text above. Answer: "
                "According to the chain(s) of variable assignment in the text above, {num_v} variables are "
                "assgined the value {query}, they are: ").replace("{num_v}", str(task.hops + 1))
    prefix, rest = template.split("{context}")
    question, middle, tail = rest.split("{query}")
    assert text.startswith(prefix)
    q_at = text.index(question)
    context = text[len(prefix):q_at]
    value = text[q_at + len(question):q_at + len(question) + 5]
    assert text[q_at + len(question) + 5:].startswith(middle + value + tail)
    answer = text[q_at + len(question) + 5 + len(middle) + 5 + len(tail):]
    # the context: elements joined by " ", each a noise line or an assignment
    noise = FILLER + "\n"
    element = re.compile(re.escape(noise) + r"|VAR ([A-Z]{5}) = (\d{5})|VAR ([A-Z]{5}) = VAR ([A-Z]{5}) ")
    pos, elements = 0, []
    while pos < len(context):
        m = element.match(context, pos)
        assert m is not None, context[pos:pos + 40]
        elements.append(m)
        pos = m.end()
        if pos < len(context):
            assert context[pos] == " "
            pos += 1
    assert ". \n" not in context  # RULER's context.replace(". \n", ".\n") changes nothing
    n = sum(m.group(0) == noise for m in elements)
    assert elements[-1].group(0) == noise  # an assignment always precedes some element
    source = {}
    for m in elements:
        if m.group(1):
            source[m.group(1)] = int(m.group(2))
        elif m.group(3):
            assert m.group(4) in source  # assigned after its source, as in a chain
            source[m.group(3)] = m.group(4)
    assert len(source) == task.chains * (task.hops + 1)
    chain = [v for v, s in source.items() if s == int(value)]
    while len(chain) < len(source) and any(s == chain[-1] for s in source.values()):
        chain.append(next(v for v, s in source.items() if s == chain[-1]))
    assert len(chain) == task.hops + 1
    assert sum(isinstance(s, int) for s in source.values()) == task.chains
    assert answer == " ".join(chain)
    full = text.encode("latin-1")
    return n, list(full), list(range(len(full) - len(answer), len(full)))


@pytest.mark.parametrize("options", [{}, {"chains": 2, "hops": 2}, {"chains": 3, "hops": 1}])
def test_variable_tracking_rows_match_the_solver(options):
    task = tasks.make("variable_tracking", **options)
    check_rows(task, solve_vt, 300)
    assert tasks.make("vt").name == "vt" and task.eval_sweep == {"hops": (1, 2, 4, 8), "chains": (1, 2, 4)}


def solve_cwe(task, row):
    text = text_of(row)
    head = ("Below is a numbered list of words. In these words, some appear more often than others. Memorize the "
            "ones that appear most often.\n")
    question = (f"\nQuestion: What are the {task.common} most common words in the above list? Answer: The top "
                f"{task.common} words that appear most often in the list are: ")
    assert text.startswith(head)
    context, answer = text[len(head):].split(question)
    items = re.findall(r"(\d+)\. ([a-z]+)", context)
    assert " ".join(f"{i}. {w}" for i, w in items) == context
    assert [int(i) for i, _ in items] == list(range(1, len(items) + 1))
    words = [w for _, w in items]
    counts = collections.Counter(words)
    assert set(words) <= set(ruler_text.WORDS)
    common = [w for w in dict.fromkeys(words) if counts[w] == task.common_repeats]
    assert len(common) == task.common
    assert all(counts[w] == task.uncommon_repeats for w in counts if w not in common)
    expected = " ".join(f"{i + 1}. {w}" for i, w in enumerate(common))
    assert answer == expected
    full = text.encode("latin-1")
    return len(counts) - task.common, list(full), list(range(len(full) - len(answer), len(full)))


@pytest.mark.parametrize("options", [{}, {"common": 3, "common_repeats": 3, "uncommon_repeats": 2}])
def test_common_words_rows_match_the_solver(options):
    task = tasks.make("common_words", **options)
    check_rows(task, solve_cwe, 200)


def fwe_counts(n, alpha):
    """RULER's int(num_words * k**-alpha / zeta(alpha)) for the ranks with a count, zeta(2) = pi^2 / 6."""
    assert alpha == 2.0
    z = math.pi**2 / 6
    counts, k = [], 1
    while int(n * k**-alpha / z) > 0:
        counts.append(int(n * k**-alpha / z))
        k += 1
    return counts


def solve_fwe(task, row):
    text = text_of(row)
    head = ("Read the following coded text and track the frequency of each coded word. Find the three most "
            "frequently appeared coded words. ")
    question = ("\nQuestion: Do not provide any explanation. Please ignore the dots '....'. What are the three most "
                "frequently appeared words in the above coded text? Answer: According to the coded text above, "
                "the three most frequently appeared words are: ")
    assert text.startswith(head)
    context, answer = text[len(head):].split(question)
    words = context.split(" ")
    code = rf"[a-z]{{{task.word_length}}}"
    assert all(w == "..." or re.fullmatch(code, w) for w in words)
    counts = collections.Counter(words)
    ranked = sorted(counts, key=lambda w: -counts[w])
    assert ranked[0] == "..."  # rank 1 is the noise word
    observed = sorted(counts.values(), reverse=True)
    n = next(m for m in range(1, 20 * len(words) + 2) if fwe_counts(m, task.alpha) == observed)
    expected = " ".join(ranked[1:4])
    assert answer == expected and len({counts[w] for w in ranked[1:5]}) == 4  # determined, in order
    full = text.encode("latin-1")
    return n, list(full), list(range(len(full) - len(answer), len(full)))


def test_frequent_words_rows_match_the_solver():
    task = tasks.make("frequent_words")
    canonical = lambda n: next(m for m in range(1, n + 1) if fwe_counts(m, 2.0) == fwe_counts(n, 2.0))  # noqa: E731
    check_rows(task, solve_fwe, 300, observed=canonical)


@pytest.mark.parametrize("name,options,error", [
    ("niah_single", {"haystack": "repeat"}, "unknown haystack 'repeat'; choose one of: essay, needle, noise"),
    ("niah_single", {"key_type": "uuid"}, "unknown key_type 'uuid'; choose one of: numbers, uuids, words"),
    ("niah_single", {"depth": 2.0}, "depth must be a finite number >= 0.0 <= 1.0; got 2.0"),
    ("niah_single", {"path": "/tmp"}, "path is the corpus of the essay haystack"),
    ("niah_multikey", {"keys": 41}, "the essay haystack places at most 40 needles"),
    ("variable_tracking", {"hops": 0}, "hops must be an integer >= 1; got 0"),
    ("common_words", {"uncommon_repeats": 6}, r"uncommon_repeats must be an integer in [1, 5]; got 6"),
    ("frequent_words", {"alpha": 1.0}, "alpha must be a finite number >= 1.01 <= 8.0; got 1.0"),
])
def test_bad_options_name_the_value_and_the_allowed_ones(name, options, error):
    with pytest.raises(ValueError, match=re.escape(error)):
        tasks.make(name, **options)
