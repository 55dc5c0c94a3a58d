"""Analysis of one trained run: where attention looks, what the position terms learned, where extrapolation breaks.

    python -m posenc analyze --workdir RUN_DIR
    python -m posenc analyze --workdir RUN_DIR --out docs/figures --prefix findings_analysis_t5_

RUN_DIR is a finished run (config.json and a checkpoint: python -m posenc train,
or one of WORKDIR/runs/<run>/ of python -m posenc compare). Writes into --out
(default RUN_DIR/analysis), each PNG only where it applies to the run:

* ``<prefix>attention.png``: attention entropy (nats) and mean attention
  distance (tokens, sum_j w_ij (i - j)) against the query position, one
  line per layer (mean over heads and examples), at the training length L
  and at ``--factor`` x L; dashed: uniform attention over the visible keys
  (entropy log(i + 1), distance i / 2); ``analysis.json`` adds each layer's
  weight on the first key per query and its mean over queries 1.. (the
  attention sink, ``first_key_share``);
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
* ``<prefix>answer_attention.png``: for tasks with answers, which key
  each answer token's query attends to at factor x L: per layer and head,
  the weights of the query that predicts answer token k (rows) over the
  key positions (columns), mean over examples (one layout when the
  examples share it: exact sizes, zero-padded operands); circles mark the
  keys whose position id equals the predicted token's, the keys a model
  with coupled ids (position coupling: the operand digits of the same
  significance) should peak on; ``analysis.json`` holds, per layer, head
  and answer token, the weight on those keys, whether the largest
  weight falls on one of them, and how far (in ids) the largest-weight
  key is from the predicted id;
* ``<prefix>answer_peaks.md``: the same per answer token as a table: its
  teacher-forced accuracy and each head's peak offset (0: a key of the
  predicted id; -9: nine ids below it) with its share of the examples;
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
evaluation; tasks that give their own position ids (position coupling)
with those ids, as training and evaluation feed them.
"""

from __future__ import annotations

import contextlib
import json
import math
import os

from posenc.studies import analyze_plots as plots

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
    """``(inputs, targets, mask, positions)`` of evaluation examples at ``length`` (positions None: 0..L-1;
    the task's ``position_ids`` where it gives them, randomized ones as evaluation draws them)."""
    import jax

    from posenc.training import eval_step, specs

    # the evaluation's positions (a training-only sampler such as PoSE's is not among them)
    batch, positions = eval_step.eval_batch(resolved.task, specs.Positions.from_config(resolved.config),
                                            jax.random.fold_in(jax.random.key(seed), length), batch_size, length)
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
    """Per layer, entropy, mean distance i - j and the weight on the first key (j = 0) against the
    query index i (means over batch, heads); ``first_key_share``: per layer, the first key's weight
    averaged over the queries i >= 1 (query 0 sees only it), the attention-sink measure of Qiu et al.
    2025 (with learned sinks, the weights over the keys sum to less than 1)."""
    import numpy as np

    out: dict = {"entropy": [], "distance": [], "first_key": [], "first_key_share": []}
    for w in weights:
        length = w.shape[-1]
        safe = np.where(w > 0, w, 1.0)
        ent = -(np.where(w > 0, w * np.log(safe), 0.0)).sum(-1)  # [B, H, Lq]
        gap = np.arange(length)[:, None] - np.arange(length)[None, :]  # i - j
        dist = (w * np.maximum(gap, 0)).sum(-1)
        out["entropy"].append(ent.mean((0, 1)).tolist())
        out["distance"].append(dist.mean((0, 1)).tolist())
        first = w[..., 0].mean((0, 1))  # [Lq]
        out["first_key"].append(first.tolist())
        out["first_key_share"].append(float(first[1:].mean()) if length > 1 else float(first[0]))
    return out


def answer_attention(weights, mask, positions=None) -> dict:
    """Where the query predicting each answer token looks: per layer, head and answer token.

    ``weights``: per layer [B, H, L, L] (:func:`attention_weights`); ``mask`` [B, L]: 1 where the
    target after input t is an answer token (query t predicts it); ``positions`` [B, L] or [L] or
    None (0..L-1): the input tokens' position ids. The predicted token at t + 1 has id
    ``positions[t + 1]``. Returns ``{"queries": [K] mean query position of answer token k,
    "weights": per layer [H, K, L] (mean over examples), "same_id": per layer [H, K] the weight on
    keys whose id equals the predicted token's (mean over examples), "peak_same_id": per layer [H,
    K] the fraction of examples whose largest weight is on such a key, "peak_offset": per layer
    [H, K] the most common id of the largest-weight key minus the predicted token's id (0: the
    peak has the predicted id; -9: it is nine ids below), "peak_offset_share": per layer [H, K]
    the fraction of examples with that offset, "same_id_keys": [K, L] the fraction of examples
    where key j has that id}``. Answer token k is the k-th masked target of
    each example (examples with fewer answer tokens count in the rows they have).
    """
    import numpy as np

    mask = np.asarray(mask) > 0
    B, L = mask.shape
    pos = np.broadcast_to(np.arange(L) if positions is None else np.asarray(positions), (B, L))
    K = int(mask.sum(1).max()) if mask.any() else 0
    # the predicted token's id (the input at t + 1); past the end, no key matches
    nxt = np.concatenate([pos[:, 1:], np.full((B, 1), -1, pos.dtype)], 1)
    same = pos[:, None, :] == nxt[:, :, None]  # [B, Lq, Lk]: key j has the id query t predicts
    same &= np.tril(np.ones((L, L), bool))[None]
    out = {"queries": [], "weights": [], "same_id": [], "peak_same_id": [], "peak_offset": [],
           "peak_offset_share": [], "same_id_keys": []}
    picks = [np.flatnonzero(mask[b]) for b in range(B)]
    rows = [[(b, int(ts[k])) for b, ts in enumerate(picks) if k < len(ts)] for k in range(K)]
    out["queries"] = [float(np.mean([t for _, t in r])) for r in rows]
    out["same_id_keys"] = [np.mean([same[b, t] for b, t in r], 0).tolist() for r in rows]
    for w in weights:
        w = np.asarray(w, np.float64)  # [B, H, L, L]
        lw, ls, lp, lo, lf = [], [], [], [], []
        for r in rows:
            bs, ts = np.array([b for b, _ in r]), np.array([t for _, t in r])
            q = w[bs, :, ts, :]  # [n, H, L]
            m = same[bs, ts][:, None, :]  # [n, 1, L]
            lw.append(q.mean(0))
            ls.append((q * m).sum(-1).mean(0))
            top = q.argmax(-1)  # [n, H]: each head's largest-weight key
            peak = np.take_along_axis(np.broadcast_to(m, q.shape), top[..., None], -1)[..., 0]
            lp.append(peak.mean(0))
            offset = np.take_along_axis(pos[bs], top, -1) - nxt[bs, ts][:, None]  # [n, H]
            mode, share = zip(*(_mode(offset[:, h]) for h in range(offset.shape[1])))
            lo.append(np.array(mode))
            lf.append(np.array(share))
        out["weights"].append(np.stack(lw, 1).tolist() if rows else [])  # [H, K, L]
        out["same_id"].append(np.stack(ls, 1).tolist() if rows else [])
        out["peak_same_id"].append(np.stack(lp, 1).tolist() if rows else [])
        out["peak_offset"].append(np.stack(lo, 1).tolist() if rows else [])
        out["peak_offset_share"].append(np.stack(lf, 1).tolist() if rows else [])
    return out


def answer_peaks_table(answer: dict, position_loss: dict) -> str:
    """Markdown: per answer token, its teacher-forced accuracy and, per layer and head, the offset of
    the peak key's id from the predicted token's id (share of examples), from :func:`answer_attention`
    and :func:`position_metrics` at one length."""
    heads = [(li, h) for li, layer in enumerate(answer["peak_offset"]) for h in range(len(layer))]
    head = "| answer token | query position | accuracy | " + " | ".join(f"L{li} H{h}" for li, h in heads) + " |"
    lines = [(f"Answer tokens at length {answer['length']}: the teacher-forced accuracy of each, and where the "
              "query predicting it peaks: the id of its largest-weight key minus the predicted token's id "
              "(0: a key of the predicted id), the most common offset over examples (its share)."), "",
             head, "|" + "---|" * (3 + len(heads))]
    for k, q in enumerate(answer["queries"]):
        t = round(q)
        acc = position_loss["accuracy"][t] if t < len(position_loss["accuracy"]) else None
        cells = [f"{answer['peak_offset'][li][h][k]:+d} ({answer['peak_offset_share'][li][h][k]:.2f})"
                 for li, h in heads]
        lines.append(f"| {k} | {q:g} | {'n/a' if acc is None else f'{acc:.3f}'} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _mode(values):
    """(the most common value, its share) of a 1-d int array; ties go to the smallest value."""
    import numpy as np

    uniq, counts = np.unique(values, return_counts=True)
    i = int(np.argmax(counts))
    return int(uniq[i]), float(counts[i] / len(values))


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


def rope_wavelengths(resolved, factor: int) -> dict | None:
    """Wavelength per rotary pair, unscaled and with PI / NTK / YaRN at ``factor`` (None: no RoPE layer)."""
    import numpy as np

    from posenc.encodings.rope import rope, rope_scaling

    spec = resolved.spec
    if "rope" not in spec.position.kinds:
        return None
    opts = spec.position.options["rope"]
    d = rope.rotary_dim(spec.unit_head_dim, opts["rotary_fraction"])
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
        written["attention"] = plots.plot_attention(profiles, resolved, name("attention.png"))

    if long in batches and resolved.config.task.name != "text" and "attention" in written:
        inputs, _, mask, positions = batches[long]
        answer = answer_attention(attention_weights(model, inputs, positions), mask, positions)
        numbers["answer_attention"] = dict(answer, length=long)
        written["answer_attention"] = plots.plot_answer_attention(answer, long, resolved,
                                                                  name("answer_attention.png"))

    curves = bias_curves(model, sorted({length - 1, long - 1}))
    if curves:
        numbers["bias_curves"] = curves
        written["bias_curves"] = plots.plot_bias(curves, resolved.spec.num_heads, resolved, name("bias_curves.png"))

    waves = rope_wavelengths(resolved, factor)
    if waves is not None:
        numbers["rope_wavelengths"] = waves
        written["rope_wavelengths"] = plots.plot_rope(waves, resolved, name("rope_wavelengths.png"))

    if long in batches:
        m = position_metrics(model, *batches[long])
        if resolved.config.task.name != "text":  # answers: index them from their first token
            import numpy as np

            answered = lambda mask: np.flatnonzero(np.asarray(mask).sum(0) > 0)  # noqa: E731
            m["first_answer_position"] = int(answered(batches[long][2])[0])
            if length in batches:
                m["train_answer_tokens"] = int(len(answered(batches[length][2])))
        numbers["position_loss"] = dict(m, length=long)
        written["position_loss"] = plots.plot_position_loss(m, long, resolved, name("position_loss.png"))
    else:
        numbers["position_loss"] = evaluate.not_applicable(resolved.config, resolved.spec, long)

    from posenc.workdir import files

    if "answer_attention" in numbers and isinstance(numbers["position_loss"], dict):
        written["answer_peaks"] = name("answer_peaks.md")
        files.atomic_write(written["answer_peaks"], answer_peaks_table(numbers["answer_attention"],
                                                                      numbers["position_loss"]))
    written["analysis"] = name("analysis.json")
    files.atomic_write(written["analysis"], json.dumps(numbers, indent=1))
    return written
