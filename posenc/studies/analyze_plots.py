"""Figures of :mod:`posenc.studies.analyze`: attention profiles, bias curves, RoPE wavelengths, loss by position."""

from __future__ import annotations

import math

from posenc.studies import figures


def shared_layers(curves: list[dict]) -> list[dict]:
    """Merge layers with identical curves (a table shared by every layer, as T5's)."""
    import numpy as np

    merged = []
    for c in curves:
        for m in merged:
            if m["kind"] == c["kind"] and all(np.array_equal(m["curves"][q], c["curves"][q]) for q in c["curves"]):
                m["layers"].append(c["layer"])
                break
        else:
            merged.append(dict(c, layers=[c["layer"]]))
    return merged


# ------------------------------------------------------------------- RoPE


def _title(resolved) -> str:
    c = resolved.config
    return (f"{c.task.name}, {c.model.position.kind}{'+randomized' if c.model.position.randomized else ''}, "
            f"{c.model.norm.kind}-{c.model.norm.placement}, seed {c.train.seed}, L = {c.task.train_length}")


def plot_attention(profiles: dict, resolved, path: str) -> str:
    plt = figures.pyplot()
    lengths = sorted(profiles)
    fig, axes = plt.subplots(2, len(lengths), figsize=(5.2 * len(lengths), 7), squeeze=False)
    for col, n in enumerate(lengths):
        for row, (key, ylabel, uniform) in enumerate((
                ("entropy", "attention entropy (nats)", lambda i: math.log(i + 1)),
                ("distance", "mean attention distance (tokens)", lambda i: i / 2))):
            ax = axes[row][col]
            for layer, ys in enumerate(profiles[n][key]):
                ax.plot(range(len(ys)), ys, label=f"layer {layer}")
            ax.plot(range(n), [uniform(i) for i in range(n)], "k--", linewidth=0.8, label="uniform")
            ax.axvline(int(resolved.config.task.train_length) - 1, color="gray", linestyle=":")
            ax.set_xlabel("query position")
            ax.set_ylabel(ylabel)
            ax.set_title(f"length {n}", fontsize=10)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
    fig.suptitle(f"attention per query position: {_title(resolved)} (dotted: training length)", fontsize=10)
    fig.tight_layout()
    figures.save(fig, path)
    return path


def plot_bias(curves: list[dict], num_heads: int, resolved, path: str) -> str:
    import numpy as np

    from posenc.encodings import alibi
    plt = figures.pyplot()
    merged = shared_layers(curves)
    fig, axes = plt.subplots(1, len(merged) + 1, figsize=(4.6 * (len(merged) + 1), 3.8), squeeze=False)
    length = int(resolved.config.task.train_length)
    for ax, c in zip(axes[0], merged):
        qs = sorted(c["curves"])
        far = np.asarray(c["curves"][qs[-1]])
        near = np.asarray(c["curves"][qs[0]])
        same = np.allclose(far[:, :near.shape[1]], near, atol=1e-5)
        for h in range(far.shape[0]):
            ax.plot(range(far.shape[1]), far[h], color=f"C{h % 10}", label=f"head {h}")
            if not same:
                ax.plot(range(near.shape[1]), near[h], color=f"C{h % 10}", linestyle="--")
        ax.axvline(length, color="gray", linestyle=":")
        layers = ", ".join(map(str, c["layers"]))
        note = "" if same else f" (solid: query {qs[-1]}, dashed: {qs[0]})"
        ax.set_title(f"{c['kind']}, layer(s) {layers}{note}", fontsize=9)
        ax.set_xlabel("distance i - j")
        ax.set_ylabel("bias")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6)
    ax = axes[0][-1]
    dist = np.arange(int(max(max(c["curves"]) for c in curves)) + 1)
    for h, m in enumerate(np.asarray(alibi.slopes(num_heads))):
        ax.plot(dist, -m * dist, color=f"C{h % 10}", label=f"head {h}: -{m:.3g} d")
    ax.axvline(length, color="gray", linestyle=":")
    ax.set_title(f"ALiBi, {num_heads} heads (fixed; reference)", fontsize=9)
    ax.set_xlabel("distance i - j")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=6)
    fig.suptitle(f"position bias against distance: {_title(resolved)} (dotted: training length)", fontsize=10)
    fig.tight_layout()
    figures.save(fig, path)
    return path


def plot_rope(w: dict, resolved, path: str) -> str:
    plt = figures.pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, (name, ys) in enumerate(w["wavelength"].items()):
        a.plot(range(len(ys)), ys, marker=".", color=f"C{i}", label=name)
        b.plot(range(len(ys)), w["pair_factor"][name], marker=".", color=f"C{i}", label=name)
    for n, style in ((w["train_length"], ":"), (w["factor"] * w["train_length"], "--")):
        a.axhline(n, color="gray", linestyle=style, linewidth=1)
    a.set_yscale("log", base=2)
    a.set_ylabel("wavelength 2 pi / theta_i (tokens)")
    a.set_title(f"wavelength per pair (dotted: L = {w['train_length']}, dashed: {w['factor']} L)", fontsize=9)
    b.set_yscale("log", base=2)
    b.set_ylabel("theta_default / theta_scaled (1: unchanged)")
    b.set_title(f"how each scaling changes each pair (factor {w['factor']})", fontsize=9)
    for ax in (a, b):
        ax.set_xlabel(f"rotary pair i (rotary_dim {w['rotary_dim']}, base {w['base']:g})")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"RoPE frequencies: {_title(resolved)} (trained with scaling '{w['run_scaling']}')", fontsize=10)
    fig.tight_layout()
    figures.save(fig, path)
    return path


def plot_position_loss(m: dict, length: int, resolved, path: str) -> str:
    """Loss and accuracy per position; for tasks with an answer, against the answer token index."""
    plt = figures.pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.0))
    xs = [i for i, v in enumerate(m["loss"]) if v is not None]
    start = m.get("first_answer_position") or 0
    mark = m.get("train_answer_tokens")
    for ax, key, ylabel in ((a, "loss", "loss (nats)"), (b, "accuracy", "token accuracy")):
        ax.plot([i - start for i in xs], [m[key][i] for i in xs], marker=".", linewidth=1)
        if mark is None:  # text: the training length as a position
            ax.axvline(int(resolved.config.task.train_length) - 1, color="gray", linestyle=":")
            ax.set_xlabel("position in the window")
        else:
            ax.axvline(mark - 0.5, color="gray", linestyle=":")
            ax.set_xlabel("answer token index (0: the first answer token)")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    where = ("dotted: training length" if mark is None else
             f"dotted: the {mark} answer tokens of a training-length example")
    fig.suptitle(f"per-position loss at length {length}: {_title(resolved)} ({where})", fontsize=10)
    fig.tight_layout()
    figures.save(fig, path)
    return path


def plot_answer_attention(answer: dict, length: int, resolved, path: str) -> str:
    """Per layer (rows) and head (columns): the weights of each answer token's query over the keys,
    circles on the keys with the predicted token's position id (in most examples)."""
    import numpy as np

    layers = answer["weights"]
    heads = len(layers[0]) if layers and layers[0] else 1
    K = len(answer["queries"])
    plt = figures.pyplot()
    fig, axes = plt.subplots(len(layers), heads, figsize=(3.6 * heads + 1.0, 0.16 * K + 2.2 * len(layers) + 0.6),
                             squeeze=False)
    marks = np.asarray(answer["same_id_keys"]) if K else np.zeros((0, length))
    ks, js = np.nonzero(marks >= 0.5)
    image = None
    for li, per_head in enumerate(layers):
        for h in range(heads):
            ax = axes[li][h]
            w = np.asarray(per_head[h]) if per_head else np.zeros((0, length))
            image = ax.imshow(w, aspect="auto", cmap="viridis", vmin=0.0, vmax=1.0, interpolation="nearest")
            ax.scatter(js, ks, s=14, facecolors="none", edgecolors="white", linewidths=0.7)
            share = np.mean(answer["peak_same_id"][li][h]) if K else float("nan")
            ax.set_title(f"layer {li}, head {h}" + (f": peak on the id {share:.2f}" if len(ks) else ""),
                         fontsize=8)
            ax.set_xlabel("key position", fontsize=8)
            ax.set_ylabel("answer token (query predicting it)", fontsize=8)
            ax.tick_params(labelsize=7)
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.8, label="attention weight (mean over examples)")
    fig.suptitle(f"answer attention at length {length}: {_title(resolved)}\n"
                 + ("circles: keys with the predicted token's position id; title: share of examples whose "
                    "largest weight is on one" if len(ks) else "no key has the predicted token's position id "
                                                                "(positions 0..L-1)"), fontsize=9)
    figures.save(fig, path)
    return path
