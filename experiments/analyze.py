"""Analysis of one trained run: where attention looks, what the position terms learned, where extrapolation breaks.

    python -m experiments.analyze --workdir RUN_DIR
    python -m experiments.analyze --workdir RUN_DIR --out docs/figures --prefix findings_analysis_t5_

RUN_DIR is a finished run (config.json and a checkpoint: experiments.train,
or one of WORKDIR/runs/<run>/ of experiments.compare). Writes into --out
(default RUN_DIR/analysis), each PNG only where it applies to the run:

* ``<prefix>attention.png``: attention entropy (nats) and mean attention
  distance (tokens, sum_j w_ij (i - j)) against the query position, one
  line per layer (mean over heads and examples), at the training length L
  and at ``--factor`` x L; dashed: uniform attention over the visible keys
  (entropy log(i + 1), distance i / 2);
* ``<prefix>bias_curves.png``: the bias each head adds against the distance
  i - j, for every layer whose encoding adds a bias from positions (T5,
  KERPLE, FIRE, ALiBi, plugins), at query positions L - 1 and factor x L - 1
  (drawn once when they agree: shift-invariant biases); ALiBi's fixed
  slopes at this head count for reference;
* ``<prefix>rope_wavelengths.png``: for runs with RoPE layers, the
  wavelength 2 pi / theta_i of each rotary pair against L and factor x L,
  unscaled and with PI, NTK and YaRN at the same factor (original length
  L), and each pair's factor theta_default / theta_scaled: the pairs each
  scaling changes (1 = unchanged);
* ``<prefix>position_loss.png``: loss and token accuracy per position at
  factor x L on the evaluation split: for synthetic tasks per answer token
  (index 0 = the first), marking how many answer tokens a training-length
  example has; for text per position, marking the training length. Where
  extrapolation breaks;
* ``<prefix>analysis.json``: the numbers behind every figure.

Attention weights are read with the model's own attention function by
attending over one-hot values (head_dim keys per call): the output of query
i is then its weight row. The model never materialises weights itself (blocked attention
keeps running sums only). Encodings with a relative value term (Shaw) add
more than the weights to the output; their attention figure is skipped.
Models with randomized positions are analysed with positions drawn as at
evaluation.
"""

from __future__ import annotations

import contextlib
import json
import math
import os

from absl import app, flags

from experiments import runtime

SCALINGS = (("default", "unscaled"), ("linear", "PI"), ("ntk", "NTK"), ("yarn", "YaRN"))


# ------------------------------------------------------------------ loading
def load(workdir: str):
    """``(resolved, model)`` of the run in ``workdir``: its config and its newest checkpoint's parameters."""
    from flax import nnx

    from posenc.model import Decoder
    from posenc.training import finetune

    run = finetune.load_run(workdir, finished=False)  # the same errors: no config.json, no checkpoint
    model = Decoder(run.resolved.spec, rngs=nnx.Rngs(0))
    nnx.update(model, run.params)
    return run.resolved, model


def eval_batch(resolved, length: int, batch_size: int, seed: int):
    """``(inputs, targets, mask, positions)`` of evaluation examples at ``length`` (positions None: 0..L-1)."""
    import jax

    from posenc.training import step

    data_key, pos_key = jax.random.split(jax.random.fold_in(jax.random.key(seed), length))
    batch = resolved.task.batch(data_key, batch_size, length, split="eval")
    positions = step.positions_for(resolved.config, pos_key, batch_size, length)
    return batch["inputs"], batch["targets"], batch["mask"], positions


# ---------------------------------------------------------------- attention
@contextlib.contextmanager
def _recording(weights: list):
    """Within the block, every attention call also appends its weights [B, H, Lq, Lk] to ``weights``."""
    import jax.numpy as jnp

    from posenc.model import attention as attn_lib

    original = attn_lib.attention

    def recorded(q, k, v, q_positions, k_positions, encoding, **kw):
        # One-hot values, head_dim keys at a time (every attention path takes values as wide as q).
        lk, width = k.shape[1], v.shape[-1]
        quiet = dict(kw, call=kw["call"].replace(stats=False))
        parts = []
        for start in range(0, lk, width):
            eye = jnp.eye(lk, width, k=-start, dtype=q.dtype)  # column c: key start + c
            onehot = jnp.broadcast_to(eye[None, :, None, :], (v.shape[0], lk, v.shape[2], width))
            parts.append(original(q, k, onehot, q_positions, k_positions, encoding, **quiet))
        w = jnp.concatenate(parts, axis=-1)[..., :lk].astype(jnp.float32)  # [B, Lq, H, Lk]
        weights.append(jnp.swapaxes(w, 1, 2))  # [B, H, Lq, Lk]
        return original(q, k, v, q_positions, k_positions, encoding, **kw)

    attn_lib.attention = recorded
    try:
        yield weights
    finally:
        attn_lib.attention = original


def attention_weights(model, tokens, positions=None) -> list:
    """Per layer, the attention weights [B, H, L, L] (numpy) of the full forward pass over ``tokens``."""
    import jax
    import numpy as np
    from flax import nnx

    graphdef, state = nnx.split(model)

    @jax.jit  # one compiled program instead of an op-by-op forward (the recorder runs while tracing)
    def forward(state, tokens, positions):
        with _recording([]) as weights:
            nnx.merge(graphdef, state)(tokens, positions)
        return weights

    return [np.asarray(w) for w in forward(state, tokens, positions)]


def attention_profile(weights) -> dict:
    """Per layer, entropy and mean distance i - j against the query index i (means over batch, heads)."""
    import numpy as np

    out = {"entropy": [], "distance": []}
    for w in weights:
        length = w.shape[-1]
        safe = np.where(w > 0, w, 1.0)
        ent = -(np.where(w > 0, w * np.log(safe), 0.0)).sum(-1)  # [B, H, Lq]
        gap = np.arange(length)[:, None] - np.arange(length)[None, :]  # i - j
        dist = (w * np.maximum(gap, 0)).sum(-1)
        out["entropy"].append(ent.mean((0, 1)).tolist())
        out["distance"].append(dist.mean((0, 1)).tolist())
    return out


# --------------------------------------------------------------- bias curves
def bias_curves(model, query_positions) -> list[dict]:
    """Per layer with a position bias: ``{"layer", "kind", "curves": {query position: [H, distances]}}``."""
    import jax.numpy as jnp
    import numpy as np

    out = []
    for i, block in enumerate(model.blocks):
        enc = block.attn.encoding
        if "logits" not in type(enc).attach_points():
            continue
        curves = {}
        for qp in query_positions:
            b = enc.bias(jnp.asarray([[qp]], jnp.int32), jnp.arange(qp + 1, dtype=jnp.int32)[None])
            if b is None:
                break
            curves[int(qp)] = np.asarray(b, np.float32)[0, :, 0, ::-1].tolist()  # distance 0..qp
        if curves:
            out.append({"layer": i, "kind": type(enc).name, "curves": curves})
    return out


def _shared_layers(curves: list[dict]) -> list[dict]:
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
def rope_wavelengths(resolved, factor: int) -> dict | None:
    """Wavelength per rotary pair, unscaled and with PI / NTK / YaRN at ``factor`` (None: no RoPE layer)."""
    import numpy as np

    from posenc import rope, rope_scaling

    spec = resolved.spec
    if "rope" not in spec.position.kinds:
        return None
    opts = spec.position.options["rope"]
    d = rope.rotary_dim(spec.head_dim, opts["rotary_fraction"])
    length = int(resolved.config.task.train_length)
    out = {"train_length": length, "factor": factor, "rotary_dim": d, "base": float(opts["base"]),
           "run_scaling": opts["scaling"], "wavelength": {}, "pair_factor": {}}
    default = None
    for kind, name in SCALINGS:
        kw = {} if kind == "default" else {"factor": float(factor)}
        if kind in rope_scaling.NEEDS_ORIGINAL_LENGTH:
            kw["original_length"] = length
        inv, _ = rope.frequencies(kind, d, base=float(opts["base"]), **kw)
        inv = np.asarray(inv, np.float64)
        default = inv if default is None else default
        out["wavelength"][name] = (2 * math.pi / inv).tolist()
        out["pair_factor"][name] = (default / inv).tolist()
    return out


# ------------------------------------------------------------ position loss
def position_metrics(model, inputs, targets, mask, positions=None) -> dict:
    """Mean loss and token accuracy per position over the masked tokens (None where nothing is masked)."""
    import jax
    import numpy as np

    from flax import nnx

    graphdef, state = nnx.split(model)

    @jax.jit
    def forward(state, inputs, positions):
        logits = nnx.merge(graphdef, state)(inputs, positions)
        return logits, jax.nn.log_softmax(logits, axis=-1)

    logits, logp = (np.asarray(x, np.float32) for x in forward(state, inputs, positions))
    t = np.asarray(targets)
    m = np.asarray(mask, np.float32)
    ce = -np.take_along_axis(logp, t[..., None], axis=-1)[..., 0]
    right = (logits.argmax(-1) == t).astype(np.float32)
    count = m.sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        loss = np.where(count > 0, (ce * m).sum(0) / count, np.nan)
        acc = np.where(count > 0, (right * m).sum(0) / count, np.nan)
    as_list = lambda a: [None if math.isnan(x) else float(x) for x in a]  # noqa: E731
    return {"loss": as_list(loss), "accuracy": as_list(acc), "count": count.astype(int).tolist()}


# ------------------------------------------------------------------ figures
def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _title(resolved) -> str:
    c = resolved.config
    return (f"{c.task.name}, {c.model.position.kind}{'+randomized' if c.model.position.randomized else ''}, "
            f"{c.model.norm.kind}-{c.model.norm.placement}, seed {c.train.seed}, L = {c.task.train_length}")


def plot_attention(profiles: dict, resolved, path: str) -> str:
    from posenc.training import plots

    plt = _pyplot()
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
    plots.save(fig, path)
    plt.close(fig)
    return path


def plot_bias(curves: list[dict], num_heads: int, resolved, path: str) -> str:
    import numpy as np

    from posenc import alibi
    from posenc.training import plots

    plt = _pyplot()
    merged = _shared_layers(curves)
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
    plots.save(fig, path)
    plt.close(fig)
    return path


def plot_rope(w: dict, resolved, path: str) -> str:
    from posenc.training import plots

    plt = _pyplot()
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
    plots.save(fig, path)
    plt.close(fig)
    return path


def plot_position_loss(m: dict, length: int, resolved, path: str) -> str:
    """Loss and accuracy per position; for tasks with an answer, against the answer token index."""
    from posenc.training import plots

    plt = _pyplot()
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
    plots.save(fig, path)
    plt.close(fig)
    return path


# --------------------------------------------------------------------- run
def analyze(workdir: str, out: str | None = None, *, prefix: str = "", factor: int = 4,
            batch_size: int = 16, seed: int = 1234) -> dict:
    """Write the figures and ``analysis.json`` of the module docstring; returns ``{name: path}``."""
    from posenc.training import evaluate

    resolved, model = load(workdir)
    out = out or os.path.join(workdir, "analysis")
    os.makedirs(out, exist_ok=True)
    length = int(resolved.config.task.train_length)
    long = factor * length
    name = lambda n: os.path.join(out, f"{prefix}{n}")  # noqa: E731
    written, numbers = {}, {"workdir": os.path.abspath(workdir), "train_length": length, "long_length": long}
    lengths = [n for n in (length, long) if evaluate.not_applicable(resolved.config, resolved.spec, n) is None]
    numbers["lengths"] = lengths
    batches = {n: eval_batch(resolved, n, batch_size, seed) for n in lengths}

    if any(b.attn.encoding.has_values for b in model.blocks):
        numbers["attention"] = "skipped: a relative value term adds more than the weights to the output"
    elif lengths:
        profiles = {n: attention_profile(attention_weights(model, batches[n][0], batches[n][3])) for n in lengths}
        numbers["attention"] = {str(n): p for n, p in profiles.items()}
        written["attention"] = plot_attention(profiles, resolved, name("attention.png"))

    curves = bias_curves(model, sorted({length - 1, long - 1}))
    if curves:
        numbers["bias_curves"] = curves
        written["bias_curves"] = plot_bias(curves, resolved.spec.num_heads, resolved, name("bias_curves.png"))

    waves = rope_wavelengths(resolved, factor)
    if waves is not None:
        numbers["rope_wavelengths"] = waves
        written["rope_wavelengths"] = plot_rope(waves, resolved, name("rope_wavelengths.png"))

    if long in batches:
        m = position_metrics(model, *batches[long])
        if resolved.config.task.name != "text":  # answers: index them from their first token
            import numpy as np

            answered = lambda mask: np.flatnonzero(np.asarray(mask).sum(0) > 0)  # noqa: E731
            m["first_answer_position"] = int(answered(batches[long][2])[0])
            if length in batches:
                m["train_answer_tokens"] = int(len(answered(batches[length][2])))
        numbers["position_loss"] = dict(m, length=long)
        written["position_loss"] = plot_position_loss(m, long, resolved, name("position_loss.png"))
    else:
        numbers["position_loss"] = evaluate.not_applicable(resolved.config, resolved.spec, long)

    from posenc.training.results import atomic_write_text

    written["analysis"] = name("analysis.json")
    atomic_write_text(written["analysis"], json.dumps(numbers, indent=1))
    return written


def define_flags() -> None:
    """The command line's flags (defined when run as a program, so importing the module defines none)."""
    flags.DEFINE_string("workdir", None, "A finished run's directory (config.json + checkpoints).")
    flags.DEFINE_string("out", None, "Output directory (default WORKDIR/analysis).")
    flags.DEFINE_string("prefix", "", "Prefix of every written file name.")
    flags.DEFINE_integer("factor", 4, "Longer evaluation length = factor x the training length.")
    flags.DEFINE_integer("batch_size", 16, "Evaluation examples per length.")
    flags.DEFINE_integer("seed", 1234, "Key of the evaluation examples.")
    flags.mark_flags_as_required(["workdir"])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    runtime.start()
    from posenc.training import loop

    loop.quiet_libraries()
    f = flags.FLAGS
    written = analyze(f.workdir, f.out, prefix=f.prefix, factor=f.factor, batch_size=f.batch_size,
                      seed=f.seed)
    for what, path in written.items():
        print(f"{what}: {path}")


if __name__ == "__main__":
    define_flags()
    runtime.main(main)
