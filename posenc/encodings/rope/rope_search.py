"""LongRoPE's evolutionary search for per-pair RoPE rescale factors (Ding et al. 2024).

A candidate is a vector lambda of ``rotary_dim // 2`` rescale factors
(``inv_i' = inv_i / lambda_i``, the ``short_factor`` / ``long_factor`` of
``posenc.rope.frequencies("longrope", ...)``) and a count n' of leading
(highest-frequency) pairs held at lambda = 1. The search follows
microsoft/LongRoPE ``evolution/algorithms``: ``GeneticAlgorithm.
run_genetic_algorithm`` (population, parents kept each iteration, mutation
and crossover children) with the mutation and crossover of
``DimPieceMonoGeneticAlgorithm`` (n' is its ``alpha_dim``):

- constraints: 1 <= lambda_i <= max_factor, lambda non-decreasing (the
  paper's monotone constraint), lambda_i = 1 for i < n';
- mutation: n' takes a Gaussian step (std 2, truncated to an int) half of
  the time; each pair i >= n' with probability ``prob`` draws a value on a
  ``step`` grid between its neighbours (1 and max_factor at the ends);
  redrawn until valid and new;
- crossover: copy genes (n', or one lambda_i) of the second parent with
  probability prob / 2 each, until the child is valid and new;
- initial population: the PI, NTK and YaRN factors (:func:`seed_factors`,
  as in the paper), then mutations of them.

Fitness is the caller's: ``fitness(lambda) -> float``, lower is better
(the paper uses the perplexity of the base model at the target length with
these factors). Parents survive each iteration, so the result is never worse
than the best seed. Everything random comes from ``numpy.random.
default_rng(seed)``: the same seed and fitness give the same search.

Differences from the official code, and why: the official YaRN seed mixes
lambda linearly between 1 and s over YaRN's ramp; here every seed is the
exact ratio of this library's own frequencies (``inv_default / inv_kind``),
so the YaRN seed is YaRN. The paper's n-hat counts initial *positions* left
unscaled (``MixedLongRoPEScaledRotaryEmbedding``); a fitness of lambda alone
cannot see positions, so n' counts leading *pairs*, as the official
``dim_piece_mono`` search. n' is enforced on every candidate (the official
mutation resets only the pairs it happens to visit), there is no
``beta_dim`` (pairs above it forced to s), and the default budget is the
official one scaled down (population 64 -> 16, parents 32 -> 8, 16 -> 4
mutations and crossovers, 40 -> 10 iterations). Duplicate candidates are
never evaluated twice (the official ``history`` check).

JSON (written and read by ``posenc.training.longrope``): one object with ``"kind":
"longrope"``, ``"rotary_dim"``, the ``frequencies`` keywords ``"base"``,
``"factor"``, ``"original_length"``, ``"short_factor"`` and
``"long_factor"`` (lists of rotary_dim // 2 floats), and ``"search"``:
{"short" | "long": {"fitness", "n_keep", "seeds": {name: fitness},
"evaluations", "seed"}} (a fitness is null where it was not finite; a
side is null when it was given as plain factors).
``frequencies("longrope", c["rotary_dim"], **frequency_kwargs(c),
seq_len=n)`` uses it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np

from posenc import checks
from posenc.encodings.rope import rope_scaling

SEEDS = ("pi", "ntk", "yarn")


def seed_factors(rotary_dim, *, factor, original_length, base=10000.0, beta_fast=32.0,
                 beta_slow=1.0) -> dict[str, np.ndarray]:
    """PI, NTK and YaRN as per-pair rescale factors lambda_i = inv_i / inv_i' (float64 [d/2]).

    PI gives s everywhere, NTK s^(2i / (d - 2)), YaRN 1 up to its ramp and s
    past it. Rounded to 1e-6 (float32 frequencies put ~1e-7 noise in the
    ratio, which would break the monotone constraint; PI is then exactly s).
    """
    d, s = int(rotary_dim), float(factor)
    inv = np.asarray(rope_scaling.default(d, base=base)[0], np.float64)
    scaled = {
        "pi": rope_scaling.linear(d, base=base, factor=s)[0],
        "ntk": rope_scaling.ntk(d, base=base, factor=s)[0],
        "yarn": rope_scaling.yarn(d, base=base, factor=s, original_length=original_length,
                                  beta_fast=beta_fast, beta_slow=beta_slow)[0],
    }
    out = {}
    for name, inv_scaled in scaled.items():
        lam = np.round(inv / np.asarray(inv_scaled, np.float64), 6)
        out[name] = np.clip(np.maximum.accumulate(lam), 1.0, max(s, 1.0))
    return out


@dataclasses.dataclass(frozen=True)
class SearchResult:
    """Best candidate of a search, with what it was compared against."""

    factors: np.ndarray  # float64 [rotary_dim // 2]: lambda
    fitness: float
    n_keep: int  # leading pairs held at lambda = 1
    seeds: dict  # seed name -> fitness of its factors
    curve: tuple  # best fitness at the start of each iteration, then at the end
    evaluations: int  # calls of the fitness
    seed: int


class _Search:
    """State of one search: the random stream, the constraints and the evaluated history."""

    def __init__(self, fitness, half, max_factor, step, prob, n_keep_std, rng):
        self.fitness, self.half, self.max_factor = fitness, half, max_factor
        self.step, self.prob, self.n_keep_std, self.rng = step, prob, n_keep_std, rng
        self.history: list[np.ndarray] = []
        self.evaluations = 0

    def valid(self, n_keep, lam) -> bool:
        return (0 <= n_keep <= self.half and bool(np.all(np.diff(lam) >= 0))
                and bool(np.all(lam >= 1.0)) and bool(np.all(lam <= self.max_factor))
                and bool(np.all(lam[:n_keep] == 1.0)))

    def seen(self, lam) -> bool:
        return any(np.allclose(lam, h) for h in self.history)

    def make(self, n_keep, lam):
        """Evaluate a new candidate: (fitness, n_keep, lambda)."""
        self.history.append(lam)
        self.evaluations += 1
        value = self.fitness(lam.copy())
        if not checks.is_real(value) and not (isinstance(value, np.ndarray) and value.ndim == 0):
            raise ValueError(f"fitness must return a number (lower is better); got {value!r}")
        value = float(value)
        # A diverged evaluation (NaN / inf perplexity) ranks last.
        return (value if math.isfinite(value) else math.inf, n_keep, lam)

    def mutate(self, indv, max_tries=100):
        """DimPieceMonoGeneticAlgorithm.mutate, with n' for alpha_dim and no beta_dim."""
        _, n_keep, lam = indv
        for _ in range(max_tries):
            new_keep, new = n_keep, lam.copy()
            if self.rng.random() < 0.5:
                new_keep = int(self.rng.normal(n_keep, self.n_keep_std))
                while not 0 <= new_keep <= self.half:
                    new_keep = int(self.rng.normal(n_keep, self.n_keep_std))
            for i in range(self.half):
                if self.rng.random() >= self.prob or i < new_keep:
                    continue
                lo = new[i - 1] if i > 0 else 1.0
                hi = new[i + 1] if i < self.half - 1 else self.max_factor
                grid = np.arange(lo, hi + self.step, self.step)
                if grid.size:
                    new[i] = min(grid[self.rng.integers(grid.size)], self.max_factor)
            new[:new_keep] = 1.0
            if self.valid(new_keep, new) and not self.seen(new):
                return self.make(new_keep, new)
        return None

    def crossover(self, indv_1, indv_2, max_tries):
        """DimPieceMonoGeneticAlgorithm.crossover: genes of parent 2 into parent 1."""
        (_, keep_1, lam_1), (_, keep_2, lam_2) = indv_1, indv_2
        if keep_1 == keep_2 and np.allclose(lam_1, lam_2):
            return None
        new_keep, new = keep_1, lam_1.copy()
        for _ in range(max_tries):
            for i in range(self.half + 1):  # gene 0 is n', gene i + 1 is lambda_i
                if self.rng.random() >= self.prob:
                    continue
                new = new.copy()
                if self.rng.random() < 0.5:
                    if i == 0:
                        new_keep = keep_2
                    else:
                        new[i - 1] = lam_2[i - 1]
                if not self.valid(new_keep, new) or self.seen(new):
                    continue
                return self.make(new_keep, new)
        return None


def search(fitness: Callable[[np.ndarray], float], rotary_dim, *, factor, original_length,
           base=10000.0, beta_fast=32.0, beta_slow=1.0, population_size=16, parents_size=8,
           mutation_numbers=4, crossover_size=4, iterations=10, max_crossover_try=20, prob=0.3,
           step=0.01, max_factor=None, n_keep_std=2.0, seed=0) -> SearchResult:
    """Evolution search for the lambda that minimises ``fitness(lambda)``.

    ``factor`` is the length scale s (target length / original length);
    ``max_factor`` (default 1.25 s, the paper's search range) bounds lambda.
    The other keywords are the official hyper-parameters (see the module
    docstring); beta_fast / beta_slow shape the YaRN seed.
    """
    d = checks.integer("rotary_dim", rotary_dim, minimum=2)
    if d % 2:
        raise ValueError(f"rotary_dim must be a positive even integer; got {d}")
    s = checks.number("factor", factor, minimum=1.0)
    max_factor = 1.25 * s if max_factor is None else checks.number("max_factor", max_factor,
                                                                     minimum=s)
    population_size = checks.integer("population_size", population_size, minimum=len(SEEDS))
    parents_size = checks.integer("parents_size", parents_size, minimum=2, maximum=population_size)
    mutation_numbers = checks.integer("mutation_numbers", mutation_numbers, minimum=0)
    crossover_size = checks.integer("crossover_size", crossover_size, minimum=0)
    iterations = checks.integer("iterations", iterations, minimum=0)
    max_crossover_try = checks.integer("max_crossover_try", max_crossover_try, minimum=1)
    prob = checks.number("prob", prob, positive=True, maximum=1.0)
    step = checks.number("step", step, positive=True)
    n_keep_std = checks.number("n_keep_std", n_keep_std, positive=True)
    seed = checks.integer("seed", seed, minimum=0)
    if not callable(fitness):
        raise ValueError(f"fitness must be a callable lambda -> float; got {fitness!r}")

    st = _Search(fitness, d // 2, max_factor, step, prob, n_keep_std, np.random.default_rng(seed))
    seeds: dict = {}
    population: list = []  # (fitness, n_keep, lambda) of every individual evaluated
    for name, lam in seed_factors(d, factor=s, original_length=original_length, base=base,
                                  beta_fast=beta_fast, beta_slow=beta_slow).items():
        match = [p for p in population if np.allclose(p[2], lam)]
        indv = match[0] if match else st.make(0, lam)  # PI = NTK = YaRN at s = 1
        seeds[name] = indv[0]
        if not match:
            population.append(indv)
    starts = list(population)
    for i in range(population_size - len(population)):
        child = st.mutate(starts[i % len(starts)])
        if child is not None:
            population.append(child)

    curve = []
    for _ in range(iterations):
        parents = _rank(population)[:parents_size]
        curve.append(parents[0][0])
        population = list(parents)
        for _ in range(mutation_numbers):
            child = st.mutate(parents[st.rng.integers(len(parents))])
            if child is not None:
                population.append(child)
        for _ in range(crossover_size):
            if len(parents) < 2:
                break
            i1, i2 = sorted(st.rng.choice(len(parents), 2, replace=False))
            child = st.crossover(parents[i1], parents[i2], max_crossover_try)
            if child is None:  # as the official code: mutate parent 1 instead
                child = st.mutate(parents[i1])
            if child is not None:
                population.append(child)
    best = _rank(population)[0]
    curve.append(best[0])
    return SearchResult(factors=best[2].copy(), fitness=best[0], n_keep=best[1], seeds=seeds,
                        curve=tuple(curve), evaluations=st.evaluations, seed=seed)


def _rank(population):
    # sorted() is stable: ties keep their order, so the search stays deterministic
    return sorted(population, key=lambda indv: indv[0])


def search_longrope(long_fitness, short_fitness, rotary_dim, *, factor, original_length,
                    base=10000.0, short_scale=1.0, seed=0, **options) -> dict:
    """Search ``long_factor`` (scale ``factor``) and ``short_factor`` (scale ``short_scale``).

    LongRoPE searches the long factors at the target length and re-searches
    short ones so that contexts up to original_length keep their quality.
    Returns the JSON object of the module docstring (``posenc.training.longrope``
    writes and reads it as a file). ``options`` go to :func:`search`.
    """
    long = search(long_fitness, rotary_dim, factor=factor, original_length=original_length,
                  base=base, seed=seed, **options)
    short = search(short_fitness, rotary_dim, factor=short_scale, original_length=original_length,
                   base=base, seed=seed, **options)
    config = longrope_config(rotary_dim=rotary_dim, base=base, factor=factor,
                             original_length=original_length, short=short, long=long)
    return config


def longrope_config(*, rotary_dim, base, factor, original_length, short, long) -> dict:
    """The JSON object for two search results (or two lambda arrays)."""
    def summary(result):
        if not isinstance(result, SearchResult):
            return None
        return dict(fitness=_finite(result.fitness), n_keep=result.n_keep,
                    seeds={k: _finite(v) for k, v in result.seeds.items()},
                    evaluations=result.evaluations, seed=result.seed)

    def factors(result):
        return [float(v) for v in (result.factors if isinstance(result, SearchResult) else result)]

    config = dict(kind="longrope", rotary_dim=int(rotary_dim), base=float(base),
                  factor=float(factor), original_length=int(original_length),
                  short_factor=factors(short), long_factor=factors(long),
                  search=dict(short=summary(short), long=summary(long)))
    check_config(config)
    return config


def _finite(value):
    return value if math.isfinite(value) else None  # JSON has no inf


def check_config(config):
    """ValueError unless ``config`` is a LongRoPE factor object with rotary_dim // 2 factors each."""
    if not isinstance(config, dict) or config.get("kind") != "longrope":
        raise ValueError(f"a LongRoPE factor file must be an object with kind 'longrope'; got "
                         f"{str(config)[:80]!r}")
    half = int(config["rotary_dim"]) // 2
    for key in ("short_factor", "long_factor"):
        if len(config[key]) != half:
            raise ValueError(f"{key} must have rotary_dim // 2 = {half} entries; got "
                             f"{len(config[key])}")


def frequency_kwargs(config) -> dict:
    """The keywords of ``frequencies("longrope", ...)`` held in a factor file."""
    return {k: config[k] for k in rope_scaling.KEYWORDS["longrope"] if k in config}
