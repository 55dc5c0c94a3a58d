"""Per-layer attention layout: sliding-window and chunked spans, length-aware logit scaling,
QK-norm on some layers, the Gemma 3 / SWAN-GPT / Llama 4 presets, and p-RoPE in the model.

Masks follow the definitions of /shared/reference/modern.md: window W keeps key j for query i
when i - W < j <= i; chunk C keeps the keys of the query's chunk (HF Llama 4
``attention_chunk_size``). References are numpy softmaxes with those masks written out.
``POSENC_SLOW=1`` adds the 64K-token windowed evaluation in a fresh process.
"""

import math
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import helpers
from posenc import alibi, logit_scale
from posenc.configs import default
from posenc.model import ENCODINGS, Decoder, Encoding, ModelSpec, registry
from posenc.model.attention import AttentionCall, attention, blocked_attention
from posenc.model.encoding import SPANS

SLOW = bool(os.environ.get("POSENC_SLOW"))
B, L, H, K, DH = 2, 13, 4, 2, 8


def reference(q, k, v, slopes, *, q_offset, kv_length, window=0, chunk=0):
    """Softmax attention with ALiBi and the span mask written out (numpy float64)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    k, v = np.repeat(k, H // K, axis=2), np.repeat(v, H // K, axis=2)
    lq, lk = q.shape[1], k.shape[1]
    i = q_offset + np.arange(lq)[:, None]
    j = np.arange(lk)[None, :]
    mask = (j <= i) & (j < kv_length)
    if window:
        mask &= i - window < j
    if chunk:
        mask &= j // chunk == i // chunk
    s = np.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(DH)
    s = s - np.asarray(slopes, np.float64)[:, None, None] * (i - j)  # ALiBi on positions = indices
    s = np.where(mask, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bhqk,bkhd->bqhd", p / p.sum(-1, keepdims=True), v)


def _qkv(lq, lk, seed=0, dtype=jnp.float32):
    kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
    return (jax.random.normal(kq, (B, lq, H, DH)).astype(dtype),
            jax.random.normal(kk, (B, lk, K, DH)).astype(dtype),
            jax.random.normal(kv, (B, lk, K, DH)).astype(dtype))


@pytest.mark.parametrize("span", [dict(window=4), dict(chunk=5)])
def test_spans_in_dense_split_and_blocked_attention_match_the_masked_reference(span):
    enc = helpers.decoder("alibi", num_heads=H, num_kv_heads=K).blocks[0].attn.encoding
    slopes = alibi.slopes(H)
    q, k, v = _qkv(L, L)
    pos = jnp.arange(L)[None]
    kw = dict(scale=1 / math.sqrt(DH), **span)

    @jax.jit
    def run(q, k, v):
        outs = [attention(q, k, v, pos, pos, enc, AttentionCall(impl="dense", **kw)),
                attention(q, k, v, pos, pos, enc, AttentionCall(impl="dense", causal_block=4, **kw)),
                attention(q, k, v, pos, pos, enc, AttentionCall(impl="blocked", block=3, **kw))]
        # queries at slots 6..12 of 13 keys, the last 2 slots unused (a cache)
        cached = [attention(q[:, :7], k, v, pos[:, 6:], pos, enc,
                            AttentionCall(q_offset=6, kv_length=11, impl=impl, block=3, **kw))
                  for impl in ("dense", "blocked")]
        grads = [jax.grad(lambda q: jnp.sum(jnp.sin(attention(
            q, k, v, pos, pos, enc, AttentionCall(impl=i, block=3, **kw)))))(q)
                 for i in ("dense", "blocked")]
        return outs, cached, grads

    outs, cached, grads = run(q, k, v)
    want = reference(q, k, v, slopes, q_offset=0, kv_length=L, **span)
    for out in outs:
        np.testing.assert_allclose(np.asarray(out), want, rtol=2e-5, atol=2e-5)
    want = reference(q[:, :7], k, v, slopes, q_offset=6, kv_length=11, **span)
    for out in cached:
        np.testing.assert_allclose(np.asarray(out), want, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(np.asarray(grads[1]), np.asarray(grads[0]), rtol=2e-5, atol=2e-5)
    full = reference(q, k, v, slopes, q_offset=0, kv_length=L)
    assert float(np.abs(full - np.asarray(outs[0])).max()) > 1e-3  # the span changes the output


def _scan_lengths(jaxpr, depth=0, found=None):
    """{depth: [scan lengths]} of a jaxpr, nested scans at depth + 1."""
    found = {} if found is None else found
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "scan":
            found.setdefault(depth, []).append(eqn.params["length"])
        for p in eqn.params.values():
            for sub in (p if isinstance(p, (list, tuple)) else [p]):
                inner = getattr(sub, "jaxpr", None)
                if inner is not None:
                    _scan_lengths(getattr(inner, "jaxpr", inner), depth + (eqn.primitive.name == "scan"),
                                  found)
    return found


def test_blocked_window_visits_only_the_key_blocks_of_the_span():
    """64 keys in blocks of 8 with a window of 8: each query block runs 3 key steps, not 8, so a
    windowed layer costs O(L (W + block)); a chunk of 16 needs 4."""
    enc = helpers.decoder("nope").blocks[0].attn.encoding
    q, k, v = _qkv(64, 64, dtype=jnp.float32)
    pos = jnp.arange(64)[None]

    def lengths(**span):
        jaxpr = jax.make_jaxpr(lambda q, k, v: blocked_attention(
            q, k, v, pos, pos, enc, AttentionCall(scale=0.3, block=8, **span)))(q, k, v)
        return _scan_lengths(jaxpr.jaxpr)

    assert lengths() == {0: [8], 1: [8]}
    assert lengths(window=8) == {0: [8], 1: [3]}
    assert lengths(chunk=16) == {0: [8], 1: [4]}


def _pieces(model, tokens, first, max_length):
    """One jit: the full forward, and a prefill of ``first`` tokens then one token per step."""
    g, state = nnx.split(model)

    @jax.jit
    def run(state, tokens):
        m = nnx.merge(g, state)
        cache = m.init_cache(tokens.shape[0], max_length)
        head, cache = m.decode(tokens[:, :first], cache)

        def step(cache, t):
            out, cache = m.decode(jax.lax.dynamic_slice_in_dim(tokens, t, 1, axis=1), cache)
            return cache, out[:, 0]

        _, tail = jax.lax.scan(step, cache, jnp.arange(first, tokens.shape[1]))
        return m(tokens), jnp.concatenate([head, jnp.moveaxis(tail, 0, 1)], 1)

    return run(state, tokens)


@pytest.mark.parametrize("model_fields", [
    dict(attention_span="window", attention_window=3, global_every=2,
         logit_scale=dict(kind="ssmax", ssmax_bias=True)),
    dict(attention_span="chunk", attention_chunk=4, logit_scale=dict(kind="logn", train_length=3)),
])
def test_cached_decoding_of_spans_and_logit_scales_equals_the_full_forward(model_fields):
    """The cache stays full-length; masks and key counts follow the window / chunk."""
    cfg = helpers.model_cfg("rope", num_kv_heads=2)
    scale = model_fields.pop("logit_scale")
    cfg.update(model_fields)
    cfg.logit_scale.update(scale)
    model = Decoder(ModelSpec.from_config(cfg, train_length=8), rngs=nnx.Rngs(0))
    tokens = helpers.tokens(2, 12)
    full, cached = _pieces(model, tokens, 5, 14)
    np.testing.assert_allclose(np.asarray(cached), np.asarray(full), rtol=2e-5, atol=2e-5)


def test_logit_scale_multipliers_count_the_keys_of_the_span():
    cfg = helpers.model_cfg("nope", num_layers=1, attention_span="window", attention_window=4)
    cfg.logit_scale.update(kind="ssmax", ssmax_init=0.7)
    attn = Decoder(ModelSpec.from_config(cfg), rngs=nnx.Rngs(0)).blocks[0].attn
    attn.ssmax_s[...] = jnp.array([0.5, 1.0, 1.5, 2.0])
    q = jnp.ones((1, 9, 4, 8))
    got = attn.scale_queries(q, jnp.arange(9)[None], q_offset=0, kv_length=9, causal=True)
    n = np.minimum(np.arange(9) + 1, 4)  # a window of 4 keys: n stops growing
    want = np.array([0.5, 1.0, 1.5, 2.0])[None, :] * np.log(n)[:, None]
    np.testing.assert_allclose(np.asarray(got[0, :, :, 0]), want, rtol=1e-6)
    # decoding: 1 query at slot 20 of 21 keys: still 4 keys
    got = attn.scale_queries(q[:, :1], jnp.array([[20]]), q_offset=jnp.int32(20), kv_length=21,
                             causal=True)
    np.testing.assert_allclose(np.asarray(got[0, 0, :, 0]), np.array([0.5, 1, 1.5, 2]) * np.log(4),
                               rtol=1e-6)
    # logn: max(1, log n / log L_train); temperature: from the position (Llama 4)
    cfg.logit_scale.update(kind="logn", ssmax_init=0.43, train_length=2)
    attn = Decoder(ModelSpec.from_config(cfg), rngs=nnx.Rngs(0)).blocks[0].attn
    got = attn.scale_queries(q, jnp.arange(9)[None], q_offset=0, kv_length=9, causal=True)
    np.testing.assert_allclose(np.asarray(got[0, :, 0, 0]), np.maximum(1, np.log(n) / np.log(2)),
                               rtol=1e-6)
    cfg.logit_scale.update(kind="temperature", train_length=0, floor_scale=4.0)
    attn = Decoder(ModelSpec.from_config(cfg), rngs=nnx.Rngs(0)).blocks[0].attn
    pos = jnp.array([[0, 3, 7, 100]])
    got = attn.scale_queries(q[:, :4], pos, q_offset=0, kv_length=4, causal=True)
    np.testing.assert_allclose(np.asarray(got[0, :, 0, 0]),
                               logit_scale.temperature(pos, floor_scale=4.0)[0], rtol=1e-6)
    assert float(got[0, 3, 0, 0]) > 1.0


def _preset(name):
    c = default.get_config("copy")
    c.task.train_length = 8
    from posenc.config import overrides
    from posenc.training.schema import Run

    overrides.apply(c, default.PRESETS[name](c), schema=Run)  # as the word: window / chunk = 8 // 2 = 4
    c.model.update(d_model=32, num_heads=4, vocab_size=16)
    return Decoder(ModelSpec.from_config(c.model, train_length=8), rngs=nnx.Rngs(0))


@pytest.mark.parametrize("name", ["gemma3", "swan", "llama4"])
def test_presets_decode_as_the_full_forward(name):
    model = _preset(name)
    tokens = helpers.tokens(1, 18)  # beyond the window / chunk of 4 and the training length 8
    full, cached = _pieces(model, tokens, 9, 18)
    np.testing.assert_allclose(np.asarray(cached), np.asarray(full), rtol=3e-5, atol=3e-5)


def test_llama4_preset_layers_and_a_training_step():
    model = _preset("llama4")
    spans = [(b.attn.window, b.attn.chunk) for b in model.blocks]
    assert spans == [(0, 4)] * 3 + [(0, 0)]  # chunked RoPE layers, a global NoPE layer
    assert [type(b.attn.encoding).name for b in model.blocks] == ["rope"] * 3 + ["nope"]
    assert [b.attn.encoding.base for b in model.blocks[:3]] == [500000.0] * 3
    assert [b.attn.qk_norm_kind for b in model.blocks] == ["rms_plain"] * 3 + ["none"]
    assert all(b.attn.qk_norm_after_rope for b in model.blocks)
    assert [b.attn.logit_scale for b in model.blocks] == ["none"] * 3 + ["temperature"]
    g, params, rest = nnx.split(model, nnx.Param, ...)
    tokens = helpers.tokens(2, 13)
    tx = optax.adam(1e-2)
    opt = tx.init(params)

    @jax.jit
    def step(params, opt):
        def loss(p):
            logits = nnx.merge(g, p, rest)(tokens[:, :-1])
            return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()
        value, grads = jax.value_and_grad(loss)(params)
        updates, opt = tx.update(grads, opt, params)
        return optax.apply_updates(params, updates), opt, value

    losses = []
    for _ in range(3):
        params, opt, value = step(params, opt)
        losses.append(float(value))
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]


def test_proportional_rope_trains_decodes_and_differs_from_partial_rotary():
    """p-RoPE (scaling proportional, fraction p: the lowest frequencies dropped, inv_freq over the
    head) is not GPT-NeoX's rotary_fraction p (the first p of the dims with their own spectrum)."""
    prope = helpers.decoder("rope", position=dict(scaling="proportional", fraction=0.5))
    neox = helpers.decoder("rope", position=dict(rotary_fraction=0.5))
    tokens = helpers.tokens(2, 12)
    full, cached = _pieces(prope, tokens, 5, 12)
    np.testing.assert_allclose(np.asarray(cached), np.asarray(full), rtol=2e-5, atol=2e-5)
    assert float(jnp.abs(full - neox(tokens)).max()) > 1e-3  # same parameters, other rotation
    g, params, rest = nnx.split(prope, nnx.Param, ...)

    @jax.jit
    def losses(params):
        loss = lambda p: optax.softmax_cross_entropy_with_integer_labels(  # noqa: E731
            nnx.merge(g, p, rest)(tokens[:, :-1]), tokens[:, 1:]).mean()
        value, grads = jax.value_and_grad(loss)(params)
        return value, loss(jax.tree.map(lambda p, d: p - 0.05 * d, params, grads))

    before, after = losses(params)
    assert float(after) < float(before)


BAD = [
    (dict(attention_span="sliding"), "unknown model.attention_span 'sliding'; choose one of: "
                                     "chunk, full, window"),
    (dict(attention_span="window"), "model.attention_window must be >= 1 for the window layers"),
    (dict(attention_window=8), r"model.attention_window=8 is set, but no layer has span 'window'"),
    (dict(global_every=2), "model.global_every=2 is set, but model.attention_span is 'full'"),
    (dict(layer_spans=("window",)), r"model.layer_spans has 1 entries"),
    (dict(layer_spans=("full", "local")), r"unknown model.layer_spans\[1\] 'local'"),
    (dict(layer_spans=("window", "full"), attention_window=4, global_every=2),
     "model.layer_spans is set: leave model.attention_span"),
    (dict(attention_span="window", attention_window=4, position=dict(kind="stickbreaking")),
     "layer 0 has span 'window', but position kind 'stickbreaking' computes its own attention"),
    (dict(logit_scale=dict(kind="ssmx")), "unknown model.logit_scale.kind 'ssmx'"),
    (dict(logit_scale=dict(kind="logn")), "model.logit_scale.train_length must be >= 2 for kind 'logn'"),
    (dict(logit_scale=dict(kind="ssmax", floor_scale=4.0)),
     "model.logit_scale.floor_scale=4.0 is set, but only kind 'temperature' uses it"),
    (dict(logit_scale=dict(layers="nope")), "model.logit_scale.layers='nope' is set, but "
                                            "model.logit_scale.kind is 'none'"),
    (dict(norm=dict(qk_norm_layers="positional")), "qk_norm_layers='positional' is set, but "
                                                   "model.norm.qk_norm is 'none'"),
    (dict(norm=dict(qk_norm="rms", qk_norm_layers="rope")), "unknown model.norm.qk_norm_layers 'rope'"),
]


@pytest.mark.parametrize("fields, message", BAD)
def test_bad_layout_fields_raise(fields, message):
    cfg = helpers.model_cfg("rope")
    fields = dict(fields)
    for section in ("logit_scale", "norm", "position"):
        if section in fields:
            cfg[section].update(fields.pop(section))
    cfg.update(fields)
    with pytest.raises(ValueError, match=message):
        ModelSpec.from_config(cfg)



class WindowedMean(Encoding):
    """Its own attention (the mean of the visible values), over full and window spans."""

    spans = ("full", "window")

    def attention(self, q, k, v, q_positions, k_positions, call):
        lq, lk = q.shape[1], k.shape[1]
        p, j = call.q_offset + jnp.arange(lq)[:, None], jnp.arange(lk)[None, :]
        visible = (j <= p) & (j < call.num_keys(lk))
        if call.window:
            visible &= j > p - call.window
        w = visible / visible.sum(-1, keepdims=True)
        vr = jnp.repeat(v, q.shape[2] // v.shape[2], axis=2)
        return jnp.einsum("qk,bkhd->bqhd", w, vr.astype(jnp.float32)).astype(q.dtype)


class FullMean(WindowedMean):
    """The same without a span declaration: a unit with its own attention supports "full" only."""

    spans = None


SPAN_FIELDS = {"full": {}, "window": dict(attention_window=4), "chunk": dict(attention_chunk=4)}


@pytest.mark.parametrize("kind", sorted(ENCODINGS) + [WindowedMean, FullMean],
                         ids=lambda k: k if isinstance(k, str) else k.__name__)
def test_what_validation_accepts_attention_runs_and_vice_versa(kind):
    """Encoding.check_span is the one span rule: a span config validation accepts is one attention
    runs for the unit, and one it refuses attention refuses (traced only: nothing compiles)."""
    q, k, v = _qkv(L, L)
    pos = jnp.arange(L)[None]
    with registry.registered(kind) as name:
        unit = helpers.decoder(name, num_layers=1).blocks[0].attn.encoding
        for span in SPANS:
            try:
                helpers.spec(name, num_layers=1, attention_span=span, **SPAN_FIELDS[span])
                validated = None
            except ValueError as e:
                validated = str(e)
            call = AttentionCall(scale=0.3, **{f.split("_")[1]: n for f, n in SPAN_FIELDS[span].items()})
            try:
                jax.eval_shape(lambda q, k, v: attention(q, k, v, pos, pos, unit, call), q, k, v)
                ran = None
            except ValueError as e:
                ran = str(e)
            assert (validated is None) == (ran is None), (name, span, validated, ran)
            if validated is not None:
                assert f"position kind {name!r}" in validated and f"position kind {name!r}" in ran
    own = {"stickbreaking", "path", "path_fox"}
    if kind in own or kind is FullMean:
        assert ENCODINGS.get(kind, kind).supported_spans() == ("full",)
    elif kind is WindowedMean:
        assert kind.supported_spans() == ("full", "window")
    else:
        assert ENCODINGS[kind].supported_spans() == SPANS


def test_a_unit_declaring_a_window_gets_it_in_its_own_attention():
    with registry.registered(WindowedMean) as name:
        model = helpers.decoder(name, num_layers=1, attention_span="window", attention_window=3)
    q, k, v = _qkv(L, L)
    pos = jnp.arange(L)[None]
    out = model.blocks[0].attn.encoding.attention(q, k, v, pos, pos,
                                                   AttentionCall(scale=0.3, window=3))
    vr = np.repeat(np.asarray(v), H // K, axis=2)
    want = np.stack([vr[:, max(i - 2, 0):i + 1].mean(1) for i in range(L)], axis=1)
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-6, atol=1e-6)
    assert model.blocks[0].attn.window == 3

_WINDOW_SCRIPT = textwrap.dedent(
    """
    import resource, sys, time, jax, jax.numpy as jnp
    from flax import nnx
    from posenc.model import Decoder
    from posenc.model.config import model_config
    c = model_config()
    c.d_model, c.num_layers, c.num_heads, c.vocab_size = 64, 2, 4, 256
    c.attention_span, c.attention_window = "window", 256
    m = Decoder(c, rngs=nnx.Rngs(0))
    g, s = nnx.split(m)
    f = jax.jit(lambda s, t: nnx.merge(g, s)(t)[:, -1])
    out = f(s, jnp.zeros((1, int(sys.argv[1])), jnp.int32))
    assert bool(jnp.isfinite(out).all())
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    """
)


@pytest.mark.skipif(not SLOW, reason="set POSENC_SLOW=1")
def test_windowed_evaluation_at_64k_tokens_fits_in_2gb():
    res = subprocess.run([sys.executable, "-c", _WINDOW_SCRIPT, "65536"], capture_output=True,
                         text=True, timeout=1200, check=True)
    peak_kb = int(res.stdout.strip().splitlines()[-1])
    assert peak_kb < 2 * 1024 * 1024, f"peak RSS {peak_kb / 1024:.0f} MB"
