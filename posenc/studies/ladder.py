"""Findings ``ladder``: exact match at one problem size against the training examples, and its trend.

A ladder grid (``compare:arithmetic_ladder``) trains the same arms at several
budgets; every row carries its budget, ``train_examples`` (the examples trained
on, :func:`posenc.training.dataset.examples_seen`). Per label (encoding arm):

* the per-seed exact match (decoded where the rows have it) at ``size``
  (default: twice the training problem size) at every budget;
* a logistic trend in log10(budget), ``EM = 1 / (1 + exp(-(a + b log10 N)))``,
  fitted to the seeds' values by quasi-binomial maximum likelihood
  (iteratively reweighted least squares; every seed one observation, the
  dispersion estimated from the Pearson residuals, so the spread between seeds
  sets the uncertainty), with the covariance of (a, b); the budget at which the
  trend reaches ``target`` (0.9), ``log10 N* = (logit(target) - a) / b``, with a
  95% interval by the delta method (t with n - 2 degrees of freedom). Where the
  values do not pin a logistic (all 0, all 1, fewer than 3 seeds' values, or a
  trend that falls), the fit is reported as such;
* a straight line in log10(budget) by least squares as a second reading, with
  its own N* and interval.

``findings.md`` gets :func:`ladder_markdown`, ``plots/findings_ladder.png``
:func:`plot_ladder`: one plot, exact match against training examples (log x),
every seed a point, the means joined, each logistic trend with its 95% band.
"""

from __future__ import annotations

import collections
import math
import os

import numpy as np

from posenc.studies import compare_report, figures, stats, tables

TARGET = 0.9
MIN_POINTS = 3  # seed values a trend needs (two parameters and a dispersion)


def _sigmoid(e):
    """1 / (1 + exp(-e)) without overflow in the far tails (tanh saturates where exp would reach inf)."""
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(e, dtype=float)))


def ladder_points(rows, size: int | None = None) -> dict:
    """``{"size", "metric", "labels": {label: {budget: {seed: value}}}}`` at problem size ``size``.

    ``size`` None: twice the training problem size of the rows. Rows without
    ``train_examples``, of other sizes, of evaluation variants or sweeps, and
    diverged rows are left out.
    """
    rows = [r for r in rows if r.get("train_examples") is not None and not r.get("sweep")
            and not r.get("eval_variant") and r.get("diverged_at_step") is None]
    if not rows:
        raise ValueError("no row carries train_examples: a ladder needs train.dataset_size > 0 "
                         "(compare:arithmetic_ladder)")
    train_sizes = {r["problem_size"] for r in rows if r["eval_length"] == r["train_length"]}
    if size is None:
        if len(train_sizes) != 1:
            raise ValueError(f"the rows have training sizes {sorted(train_sizes)}; pass size")
        size = 2 * next(iter(train_sizes))
    metric = "decoded_exact_match" if any(r.get("decoded_exact_match") is not None for r in rows) else "exact_match"
    vary = compare_report._vary(rows)
    labels: dict = collections.defaultdict(lambda: collections.defaultdict(dict))
    for r in rows:
        if r.get("problem_size") == size and r.get(metric) is not None:
            labels[compare_report._label(r, vary)][int(r["train_examples"])][r["seed"]] = float(r[metric])
    if not labels:
        raise ValueError(f"no row at problem size {size}; the sizes are "
                         f"{sorted({r.get('problem_size') for r in rows if r.get('problem_size')})}")
    return {"size": size, "metric": metric,
            "labels": {k: dict(sorted(v.items())) for k, v in sorted(labels.items())}}


def _xy(by_budget: dict) -> tuple[np.ndarray, np.ndarray]:
    pairs = [(math.log10(n), v) for n, seeds in by_budget.items() for v in seeds.values()]
    return np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])


def fit_logistic(x, y, *, target: float = TARGET) -> dict:
    """The quasi-binomial logistic fit of ``y`` (in [0, 1]) on ``x`` (log10 budgets); see the module docstring.

    Returns ``{"ok", "why", "a", "b", "cov", "dispersion", "x_target", "x_low", "x_high", "n"}``
    (``x_*`` in log10 budget; ``x_low`` / ``x_high`` None where the interval is unbounded).
    """
    x, y = np.asarray(x, float), np.clip(np.asarray(y, float), 0.0, 1.0)
    out = {"ok": False, "why": "", "n": int(x.size), "a": None, "b": None, "cov": None, "dispersion": None,
           "x_target": None, "x_low": None, "x_high": None}
    if x.size < MIN_POINTS or len(set(x.tolist())) < 2:
        out["why"] = f"fewer than {MIN_POINTS} values or one budget"
        return out
    if np.all(y <= 0.0) or np.all(y >= 1.0):
        out["why"] = f"every value is {y[0]:.0f}: no trend to fit"
        return out
    binary = np.all((y <= 0.0) | (y >= 1.0))
    if binary and x[y <= 0.0].max() < x[y >= 1.0].min():
        out["why"] = "the values separate completely (0 below a budget, 1 above): the logistic slope is not identified"
        return out
    X = np.stack([np.ones_like(x), x], axis=1)
    beta = np.zeros(2)
    beta[0] = math.log((y.mean() + 1e-3) / (1 - y.mean() + 1e-3))
    for _ in range(100):  # IRLS: Newton's method for the binomial log-likelihood
        eta = X @ beta
        p = _sigmoid(eta)
        w = np.clip(p * (1 - p), 1e-9, None)
        step = np.linalg.lstsq(X * np.sqrt(w)[:, None], (y - p) / np.sqrt(w), rcond=None)[0]
        beta = beta + step
        if np.max(np.abs(step)) < 1e-10 or np.max(np.abs(beta)) > 1e3:
            break
    if not np.all(np.isfinite(beta)) or np.max(np.abs(beta)) > 1e3:
        out["why"] = "the values separate completely: the logistic slope is not identified"
        return out
    p = _sigmoid(X @ beta)
    w = np.clip(p * (1 - p), 1e-9, None)
    df = x.size - 2
    dispersion = max(float(np.sum((y - p) ** 2 / w) / df), 1e-12) if df > 0 else 1.0
    cov = np.linalg.inv(X.T @ (X * w[:, None])) * dispersion
    a, b = float(beta[0]), float(beta[1])
    out.update(a=a, b=b, cov=cov, dispersion=dispersion)
    if b <= 0:
        out["why"] = f"the trend does not rise with the budget (slope {b:.3g} per decade)"
        return out
    logit = math.log(target / (1 - target))
    xt = (logit - a) / b
    grad = np.array([-1 / b, -(logit - a) / b ** 2])
    se = math.sqrt(max(float(grad @ cov @ grad), 0.0))
    t = stats.t_quantile(0.975, max(df, 1))
    out.update(ok=True, x_target=xt, x_low=xt - t * se, x_high=xt + t * se)
    return out


def fit_linear(x, y, *, target: float = TARGET) -> dict:
    """Least squares ``y = c + d x`` (x: log10 budgets) and where it reaches ``target``, with a delta-method
    95% interval: ``{"ok", "why", "c", "d", "x_target", "x_low", "x_high", "n"}``."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    out = {"ok": False, "why": "", "n": int(x.size), "c": None, "d": None, "x_target": None, "x_low": None,
           "x_high": None}
    if x.size < MIN_POINTS or len(set(x.tolist())) < 2:
        out["why"] = f"fewer than {MIN_POINTS} values or one budget"
        return out
    X = np.stack([np.ones_like(x), x], axis=1)
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    resid = y - X @ coef
    df = x.size - 2
    s2 = float(resid @ resid / df) if df > 0 else 0.0
    cov = np.linalg.inv(X.T @ X) * s2
    c, d = float(coef[0]), float(coef[1])
    out.update(c=c, d=d)
    if d <= 0:
        out["why"] = f"the line does not rise with the budget (slope {d:.3g} per decade)"
        return out
    xt = (target - c) / d
    grad = np.array([-1 / d, -(target - c) / d ** 2])
    se = math.sqrt(max(float(grad @ cov @ grad), 0.0))
    t = stats.t_quantile(0.975, max(df, 1))
    out.update(ok=True, x_target=xt, x_low=xt - t * se, x_high=xt + t * se)
    return out


def ladder_fits(points: dict, *, target: float = TARGET) -> dict:
    """``{label: {"logistic": fit_logistic, "linear": fit_linear}}`` of :func:`ladder_points`."""
    return {label: {"logistic": fit_logistic(*_xy(b), target=target), "linear": fit_linear(*_xy(b), target=target)}
            for label, b in points["labels"].items()}


def _budget(x) -> str:
    """A budget of log10 ``x`` as a number; past 10^12 (or below 10^-12) as a power of ten, since a weak
    trend's interval can reach budgets a float cannot hold."""
    if x is None:
        return "n/a"
    return f"{10 ** x:.3g}" if abs(x) <= 12 else f"10^{x:.0f}"


def _reach(fit) -> str:
    if not fit["ok"]:
        return f"not estimated ({fit['why']})"
    return f"{_budget(fit['x_target'])} [{_budget(fit['x_low'])}, {_budget(fit['x_high'])}]"


def ladder_markdown(rows, size: int | None = None, *, target: float = TARGET) -> str:
    """The ladder's table (label x budget: mean [95% t-interval] {min-max} over seeds) and its trends."""
    points = ladder_points(rows, size)
    fits = ladder_fits(points, target=target)
    budgets = sorted({n for b in points["labels"].values() for n in b})
    lines = [f"## Exact match at problem size {points['size']} against training examples", "",
             f"{points['metric']} per budget (examples trained on, train_examples): {tables.INTERVAL_NOTE}.", ""]
    body = [[label] + [tables.number(stats.interval(list(b[n].values())), metric="exact_match")
                       if n in b else "n/a" for n in budgets] for label, b in points["labels"].items()]
    lines += tables.table(["label"] + [f"{n:.3g}" for n in budgets], body)
    lines += [f"Trends in log10(examples): logistic (quasi-binomial, seeds as observations) and a straight "
              f"line; the examples at which each reaches {target} with its 95% interval (delta method).", ""]
    trend = []
    for label, f in fits.items():
        lg, ln = f["logistic"], f["linear"]
        shape = (f"a = {lg['a']:.2f}, b = {lg['b']:.2f} per decade, dispersion {lg['dispersion']:.2g}"
                 if lg["a"] is not None else "n/a")
        trend.append([label, shape, _reach(lg), _reach(ln), str(lg["n"])])
    lines += tables.table(["label", "logistic", f"logistic reaches {target}", f"line reaches {target}",
                           "values"], trend)
    return "\n".join(lines)


def plot_ladder(rows, path: str, size: int | None = None, *, target: float = TARGET) -> str:
    """One plot: exact match at ``size`` against training examples (log x), every seed a point, the
    means joined, each label's logistic trend with its 95% band and the target line; the path."""
    points = ladder_points(rows, size)
    fits = ladder_fits(points, target=target)
    plt = figures.pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, (label, by_budget) in enumerate(points["labels"].items()):
        color = colors[k % len(colors)]
        budgets = sorted(by_budget)
        for n in budgets:
            vs = list(by_budget[n].values())
            ax.scatter([n] * len(vs), vs, color=color, alpha=0.5, s=14)
        ax.plot(budgets, [float(np.mean(list(by_budget[n].values()))) for n in budgets], "o-", color=color,
                label=label, lw=1)
        lg = fits[label]["logistic"]
        if lg["a"] is not None:
            last = math.log10(budgets[-1])  # the trend drawn to its target, at most 3 decades past the ladder
            xs = np.linspace(math.log10(budgets[0]), min(max(last, lg["x_target"] or 0), last + 3), 100)
            X = np.stack([np.ones_like(xs), xs], axis=1)
            eta = X @ np.array([lg["a"], lg["b"]])
            se = np.sqrt(np.maximum(np.einsum("ij,jk,ik->i", X, lg["cov"], X), 0.0))
            ax.plot(10 ** xs, _sigmoid(eta), "--", color=color, lw=1)
            ax.fill_between(10 ** xs, _sigmoid(eta - 1.96 * se), _sigmoid(eta + 1.96 * se), color=color, alpha=0.12)
    ax.axhline(target, color="gray", lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("training examples (train_examples)")
    ax.set_ylabel(f"{points['metric']} at size {points['size']}")
    ax.set_title("Exact match against training examples: seeds (dots), means, logistic trends (dashed, 95%)",
                 fontsize=8)
    ax.legend(fontsize=8)
    return figures.save(fig, path)


def write(rows, workdir: str, size: int | None = None) -> list[str]:
    """``findings.md`` and ``plots/findings_ladder.png`` of a ladder grid's rows; the paths."""
    md = os.path.join(workdir, "findings.md")
    tables.write(md, ladder_markdown(rows, size))
    os.makedirs(os.path.join(workdir, "plots"), exist_ok=True)
    return [md, plot_ladder(rows, os.path.join(workdir, "plots", "findings_ladder.png"), size)]
