"""posenc.rope_search: the LongRoPE evolution search on a cheap synthetic fitness.

Checked: the PI / NTK / YaRN seeds reproduce this library's frequencies; every
candidate the fitness sees obeys the constraints (monotone, bounded, the first
n' pairs unscaled in the result); the result is never worse than the seeds;
the search is deterministic from its seed; the JSON factor file round-trips
into ``frequencies("longrope", ...)``.
"""

import json
import math
import os
import re

import numpy as np
import pytest

from posenc import rope, rope_search
from posenc.training import longrope

D, S, L = 16, 4.0, 64  # 8 pairs, scale 4, original length 64
# Fast settings: every search here is pure NumPy and takes well under a second.
FAST = dict(population_size=8, parents_size=4, mutation_numbers=3, crossover_size=3, iterations=6)

# A synthetic optimum: monotone, the first two pairs unscaled, up to 1.1 s.
TARGET = np.concatenate([np.ones(2), np.linspace(1.3, 4.4, D // 2 - 2)])


class Recorder:
    """A fitness (mean squared log error to TARGET) that records what it was asked."""

    def __init__(self, target=TARGET):
        self.target, self.calls = target, []

    def __call__(self, lam):
        assert isinstance(lam, np.ndarray) and lam.shape == (D // 2,)
        self.calls.append(lam.copy())
        return float(np.mean((np.log(lam) - np.log(self.target)) ** 2))


def test_seeds_are_this_librarys_frequencies():
    seeds = rope_search.seed_factors(D, factor=S, original_length=L)
    assert tuple(seeds) == rope_search.SEEDS
    np.testing.assert_array_equal(seeds["pi"], np.full(D // 2, S))
    np.testing.assert_allclose(seeds["ntk"], S ** (np.arange(0, D, 2) / (D - 2)), rtol=1e-6)
    for name, kind_kw in (("pi", ("linear", {})), ("ntk", ("ntk", {})),
                          ("yarn", ("yarn", dict(original_length=L)))):
        kind, kw = kind_kw
        want, _ = rope.frequencies(kind, D, factor=S, **kw)
        got, _ = rope.frequencies("longrope", D, original_length=L, short_factor=seeds[name],
                                  long_factor=seeds[name])
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-6, err_msg=name)
        assert np.all(np.diff(seeds[name]) >= 0) and seeds[name].min() >= 1.0
    yarn = seeds["yarn"]
    assert yarn[0] == 1.0 and yarn[-1] == S and 1.0 < yarn[1] < S  # unscaled, ramp, PI


def test_search_constraints_and_never_worse_than_its_seeds():
    fitness = Recorder()
    result = rope_search.search(fitness, D, factor=S, original_length=L, seed=0)  # default budget
    max_factor = 1.25 * S
    for lam in fitness.calls:  # every candidate, not only the winner
        assert np.all(np.diff(lam) >= 0), lam
        assert lam.min() >= 1.0 and lam.max() <= max_factor, lam
    lam = result.factors
    assert lam.shape == (D // 2,) and lam.dtype == np.float64
    assert 0 <= result.n_keep <= D // 2 and np.all(lam[: result.n_keep] == 1.0)
    assert set(result.seeds) == set(rope_search.SEEDS)
    assert result.fitness <= min(result.seeds.values())
    assert result.fitness < 0.5 * min(result.seeds.values())  # it does search
    assert list(result.curve) == sorted(result.curve, reverse=True)  # parents survive
    assert result.evaluations == len(fitness.calls)
    # no candidate is evaluated twice
    assert len({tuple(np.round(c, 12)) for c in fitness.calls}) == len(fitness.calls)
    assert result.fitness == fitness(lam)  # the reported value is the fitness of the factors


def test_search_is_deterministic_from_its_seed():
    runs = [rope_search.search(Recorder(), D, factor=S, original_length=L, seed=s, **FAST)
            for s in (3, 3, 4)]
    a, b, c = runs
    np.testing.assert_array_equal(a.factors, b.factors)
    assert (a.fitness, a.n_keep, a.curve, a.evaluations) == (b.fitness, b.n_keep, b.curve,
                                                             b.evaluations)
    assert not (np.array_equal(a.factors, c.factors) and a.curve == c.curve)


def test_seed_wins_when_nothing_beats_it():
    # The optimum is the PI seed itself: the search keeps it.
    result = rope_search.search(Recorder(np.full(D // 2, S)), D, factor=S, original_length=L,
                                **FAST)
    np.testing.assert_array_equal(result.factors, np.full(D // 2, S))
    assert result.fitness == 0.0 == result.seeds["pi"]


def test_diverged_fitness_ranks_last():
    def fitness(lam):  # "perplexity" blows up whenever a high pair is left below 2
        return math.nan if lam[-1] < 2.0 else float(np.sum((lam - 3.0) ** 2))

    result = rope_search.search(fitness, D, factor=S, original_length=L, **FAST)
    assert math.isfinite(result.fitness) and result.factors[-1] >= 2.0


def test_factor_one_has_a_single_seed():
    fitness = Recorder(np.full(D // 2, 1.1))
    result = rope_search.search(fitness, D, factor=1.0, original_length=L, **FAST)
    np.testing.assert_array_equal(fitness.calls[0], np.ones(D // 2))  # PI = NTK = YaRN = 1
    assert not any(np.array_equal(c, np.ones(D // 2)) for c in fitness.calls[1:])
    assert result.factors.max() <= 1.25 and result.fitness < result.seeds["pi"]


def test_search_longrope_writes_a_config_frequencies_takes(tmp_path):
    path = os.path.join(tmp_path, "factors.json")
    config = rope_search.search_longrope(
        Recorder(), Recorder(np.full(D // 2, 1.05)), D, factor=S, original_length=L, seed=1, **FAST)
    longrope.write_factors(path, config)
    with open(path) as f:
        raw = json.load(f)
    assert raw == config == longrope.read_factors(path)
    assert set(raw) == {"kind", "rotary_dim", "base", "factor", "original_length", "short_factor",
                        "long_factor", "search"}
    assert raw["kind"] == "longrope" and raw["rotary_dim"] == D
    assert len(raw["short_factor"]) == len(raw["long_factor"]) == D // 2
    assert max(raw["short_factor"]) <= 1.25 < max(raw["long_factor"])
    assert set(raw["search"]["long"]) == {"fitness", "n_keep", "seeds", "evaluations", "seed"}
    kw = rope_search.frequency_kwargs(raw)
    assert set(kw) == {"base", "factor", "original_length", "short_factor", "long_factor"}
    short, _ = rope.frequencies("longrope", raw["rotary_dim"], **kw, seq_len=L)
    long, af = rope.frequencies("longrope", raw["rotary_dim"], **kw, seq_len=L + 1)
    default, _ = rope.frequencies("default", D)
    np.testing.assert_allclose(np.asarray(long), np.asarray(default) / np.array(raw["long_factor"]),
                               rtol=1e-6)
    np.testing.assert_allclose(np.asarray(short),
                               np.asarray(default) / np.array(raw["short_factor"]), rtol=1e-6)
    assert af == pytest.approx(math.sqrt(1 + math.log(S) / math.log(L)))


def test_plain_factors_and_bad_files(tmp_path):
    config = rope_search.longrope_config(rotary_dim=4, base=1e4, factor=2.0, original_length=8,
                                         short=[1.0, 1.0], long=np.array([1.0, 2.0]))
    assert config["search"] == {"short": None, "long": None}
    path = os.path.join(tmp_path, "f.json")
    longrope.write_factors(path, config)
    assert longrope.read_factors(path)["long_factor"] == [1.0, 2.0]
    msg = "long_factor must have rotary_dim // 2 = 2 entries; got 3"
    with pytest.raises(ValueError, match=re.escape(msg)):
        rope_search.longrope_config(rotary_dim=4, base=1e4, factor=2.0, original_length=8,
                                    short=[1.0, 1.0], long=[1.0, 2.0, 3.0])
    with open(path, "w") as f:
        json.dump({"kind": "yarn"}, f)
    with pytest.raises(ValueError, match="kind 'longrope'"):
        longrope.read_factors(path)


@pytest.mark.parametrize("kwargs, match", [
    (dict(parents_size=20), "parents_size must be an integer in [2, 8]; got 20"),
    (dict(population_size=2), "population_size must be an integer >= 3; got 2"),
    (dict(max_factor=2.0), "max_factor must be a finite number >= 4.0; got 2.0"),
    (dict(prob=0.0), "prob must be a finite number > 0 <= 1.0; got 0.0"),
])
def test_search_errors(kwargs, match):
    options = dict(FAST, **kwargs)
    with pytest.raises(ValueError, match=re.escape(match)):
        rope_search.search(Recorder(), D, factor=S, original_length=L, **options)
    with pytest.raises(ValueError, match="fitness must return a number"):
        rope_search.search(lambda lam: "low", D, factor=S, original_length=L, **FAST)
    with pytest.raises(ValueError, match="rotary_dim must be a positive even integer; got 7"):
        rope_search.search(Recorder(), 7, factor=S, original_length=L)
