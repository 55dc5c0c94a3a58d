"""The decoder on the fused Pallas kernel (posenc.model.fused) and the bf16 compute policy.

CPU: ``attention_impl="pallas"`` runs the kernel in the Pallas interpreter and
must equal the XLA dense path, logits and gradients of the loss w.r.t. every
parameter, for every unit with kernel terms (one model, one layer per unit,
so two compiles cover them all), and in cached decoding. ``"auto"`` picks the
kernel on GPU / TPU (checked by tracing with the platform reported as "gpu")
and keeps the XLA path for statistics and for units without an in-kernel
form. bf16 compute: traced programs keep softmax, norm statistics and RoPE
angles in float32 and every matmul in bf16, parameters and gradients float32.

Tests marked ``accelerator`` run compiled kernels and are skipped on CPU
(``pytest -m accelerator`` on a GPU / TPU machine; see benchmarks/).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import helpers
from posenc.model import ENCODINGS, Decoder, ModelSpec, fused
from posenc.model.encoding import overrides
from posenc.model.registry import read_options

B, L = 2, 12
# Every unit with logit terms in the kernel (the registry decides).
KINDS = tuple(sorted(k for k, c in ENCODINGS.items() if overrides(c, "kernel_terms")))
# Those a soft-cap may follow (not Hard-ALiBi's hidden keys), and PoPE: q, k wider than v.
CAPPED = tuple(k for k in KINDS if not ENCODINGS[k].hides_keys(read_options(k, None))) + ("pope",)


def accelerator(test):
    """Compiled kernels: marked for ``-m accelerator`` and skipped without a GPU / TPU."""
    skip = pytest.mark.skipif(not fused.on_accelerator(), reason="needs a GPU or TPU")
    return pytest.mark.accelerator(skip(test))


@pytest.fixture
def interpreted():
    """Kernels in the Pallas interpreter whatever the machine (exact float32 comparisons)."""
    with fused.force_backend("cpu"):
        yield


def _cfg(impl, kinds=KINDS, **model):
    cfg = helpers.model_cfg(kinds[0], num_layers=len(kinds), attention_impl=impl, num_kv_heads=2,
                            **model)
    cfg.position.layer_kinds = tuple(kinds)
    # Small term programs (the kernel unrolls T5's buckets and FIRE's hidden units): fewer
    # equations to trace and compile.
    if "t5" in kinds:
        cfg.position.t5.update(num_buckets=8, max_distance=16)
    if "fire" in kinds:
        cfg.position.fire.hidden = 4
    return cfg


def _model(impl, kinds=KINDS, *, train_length=16, **model):
    spec = ModelSpec.from_config(_cfg(impl, kinds, **model), train_length=train_length)
    return Decoder(spec, rngs=nnx.Rngs(0))


def _perturbed(model, scale=0.05):
    """Noise on every parameter so that no term sits at a special point (T5 table, FIRE MLP)."""
    state = nnx.state(model, nnx.Param)
    leaves, tree = jax.tree.flatten(state)
    rng = np.random.default_rng(5)
    nnx.update(model, jax.tree.unflatten(
        tree, [x + scale * rng.normal(size=x.shape).astype(np.float32) for x in leaves]))
    return model


def _loss_fn(model, tokens, *, return_stats=False):
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss(params):
        out = nnx.merge(graphdef, params, rest)(tokens, return_stats=return_stats)
        logits = out[0] if return_stats else out
        return jnp.sum(jax.nn.log_softmax(logits) * jnp.cos(logits)), logits

    return loss, params


def _primitives(jaxpr):
    """Every equation of a jaxpr and of the jaxprs inside its equations (scan, cond, pallas_call, ...)."""
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                sub = getattr(sub, "jaxpr", sub)  # ClosedJaxpr -> Jaxpr
                if hasattr(sub, "eqns"):
                    yield from _primitives(sub)


def _names(fn, *args):
    return {e.primitive.name for e in _primitives(jax.make_jaxpr(fn)(*args).jaxpr)}


# ---------------------------------------------------------------- kernel == XLA path

def test_pallas_model_equals_the_dense_path_values_and_parameter_gradients(interpreted):
    """One layer per unit with kernel terms (but those hiding keys: no soft-cap for them) and a
    PoPE layer, GQA 4/2, soft-capped logits."""
    assert {"alibi", "t5", "kerple_log", "kerple_power", "fire", "pope"} <= set(CAPPED)
    tokens = helpers.tokens(B, L)
    results = {}
    for impl in ("dense", "pallas"):
        model = _perturbed(_model(impl, CAPPED, norm=dict(attn_softcap=6.0)))
        loss, params = _loss_fn(model, tokens)
        (value, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
        results[impl] = (value, logits, grads)
    (v_d, lg_d, g_d), (v_p, lg_p, g_p) = results["dense"], results["pallas"]
    np.testing.assert_allclose(lg_p, lg_d, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(v_p, v_d, rtol=1e-5)
    paths = jax.tree_util.tree_flatten_with_path(g_d)[0]
    for (path, want), got in zip(paths, jax.tree.leaves(g_p), strict=True):
        atol = 1e-4 * float(jnp.abs(want).max())  # float32 sums in another order (cancelling)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=atol, err_msg=jax.tree_util.keystr(path))
    # every unit's parameters get a gradient through the kernel (not zeros that match zeros)
    for i, kind in enumerate(CAPPED):
        attn = g_p["blocks"][i]["attn"]
        unit = jax.tree.leaves(attn["encoding"]) if "encoding" in attn else []
        if kind == "alibi":
            assert not unit, kind  # no parameters
        else:
            assert max(float(jnp.abs(x).max()) for x in unit) > 1e-4, kind


def test_cached_decoding_with_the_kernel_equals_the_full_forward(interpreted):
    """Prefill then single steps: traced q_offset and kv_length reach the kernel (FIRE: its
    normaliser reads the query positions, so a wrong offset would show; Hard-ALiBi: its windows)."""
    kinds = ("fire", "hard_alibi")
    tokens = helpers.tokens(B, L)
    model = _perturbed(_model("pallas", kinds))
    graphdef, state = nnx.split(model)
    dense, dense_state = nnx.split(_perturbed(_model("dense", kinds)))
    full = jax.jit(lambda s, t: nnx.merge(dense, s)(t))(dense_state, tokens)
    step = jax.jit(lambda state, t, cache: nnx.merge(graphdef, state).decode(t, cache))
    cache = model.init_cache(B, 16)
    logits, cache = step(state, tokens[:, :8], cache)
    outs = [logits]
    for i in range(8, L):
        logits, cache = step(state, tokens[:, i:i + 1], cache)
        outs.append(logits)
    np.testing.assert_allclose(jnp.concatenate(outs, axis=1), full, rtol=1e-5, atol=1e-5)


def test_window_and_chunk_spans_through_the_kernel_equal_the_dense_path(interpreted):
    """attention(impl="pallas") with a causal sliding window, and with chunks without the causal
    mask (the kernel's chunk test is the same with it), equals the dense path: values and
    gradients of q, k, v and the T5 table."""
    from posenc.model import attention

    unit = _perturbed(_model("dense", ("t5", "t5"))).blocks[0].attn.encoding
    rng = np.random.default_rng(9)
    q, k, v, w = (jnp.asarray(rng.normal(size=s), jnp.float32)
                  for s in ((1, 10, 4, 8), (1, 10, 2, 8), (1, 10, 2, 8), (1, 10, 4, 8)))
    pos = jnp.arange(10)[None]
    graphdef, state = nnx.split(unit)

    def run(impl, span):
        def loss(q, k, v, state):
            out = attention.attention(q, k, v, pos, pos, nnx.merge(graphdef, state),
                                      attention.AttentionCall(scale=0.4, impl=impl, **span))
            return jnp.sum(out * w)
        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))(q, k, v, state)

    for span in (dict(window=3), dict(chunk=4, causal=False)):
        (want, g_want), (got, g_got) = run("dense", span), run("pallas", span)
        np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=str(span))
        for a, b in zip(jax.tree.leaves(g_got), jax.tree.leaves(g_want), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=str(span))


# ---------------------------------------------------------------- dispatch

def test_auto_takes_the_kernel_on_accelerators_only():
    """Traced (nothing compiles): pallas_call appears in the program of "auto" when the platform
    is a GPU, not on CPU, not when statistics are asked for, not for units without kernel form."""
    tokens = helpers.tokens(B, L)

    def program(kind, *, return_stats=False):
        model = _model("auto", (kind, kind))
        loss, params = _loss_fn(model, tokens, return_stats=return_stats)
        return _names(jax.grad(loss, has_aux=True), params)

    with fused.force_backend("cpu"):
        assert "pallas_call" not in program("alibi")
    with fused.force_backend("gpu"):
        for kind in ("alibi", "t5", "rope"):
            assert "pallas_call" in program(kind), kind
        assert "pallas_call" not in program("alibi", return_stats=True)
        for kind in ("shaw", "cope", "test_scaled_alibi"):  # content terms; a bias with no kernel form
            assert "pallas_call" not in program(kind), kind
    with pytest.raises(ValueError, match="unknown backend 'cuda'; choose one of: cpu, gpu, tpu"):
        with fused.force_backend("cuda"):
            pass
    host = jax.default_backend()  # every context left: the host's own platform again
    assert fused.platform() == {"cuda": "gpu", "rocm": "gpu"}.get(host, host)


def test_pallas_falls_back_for_statistics_and_rejects_units_without_kernel_form(interpreted):
    tokens = helpers.tokens(B, L)
    model = _model("pallas", ("alibi", "t5"))
    loss, params = _loss_fn(model, tokens, return_stats=True)
    assert "pallas_call" not in _names(loss, params)  # statistics: the XLA path
    loss, params = _loss_fn(model, tokens)
    assert "pallas_call" in _names(loss, params)
    for kind in ("shaw", "transformer_xl", "test_scaled_alibi"):
        with pytest.raises(ValueError, match=f"attention_impl='pallas' needs encodings with an "
                                             f"in-kernel form; {kind} has none"):
            ModelSpec.from_config(_cfg("pallas", ("rope", kind)), train_length=16)
    # a unit without kernel form called with impl="pallas" directly
    from posenc.model import attention

    unit = _model("dense", ("shaw", "shaw")).blocks[0].attn.encoding
    q = jnp.zeros((1, 4, 4, 8))
    pos = jnp.arange(4)[None]
    with pytest.raises(ValueError, match="attention_impl 'pallas' cannot run this call: encoding "
                                         "'shaw' has no in-kernel form"):
        attention.attention(q, q, q, pos, pos, unit, attention.AttentionCall(scale=0.3, impl="pallas"))


def test_dtype_auto_is_bfloat16_on_accelerators_and_float32_on_cpu():
    cfg = _cfg("auto", ("rope", "rope"), dtype="auto")
    with fused.force_backend("cpu"):
        assert ModelSpec.from_config(cfg, train_length=16).dtype == "float32"
    for platform in ("gpu", "tpu"):
        with fused.force_backend(platform):
            assert ModelSpec.from_config(cfg, train_length=16).dtype == "bfloat16"
    with pytest.raises(ValueError, match="unknown model.dtype 'float16'; choose one of: auto, "
                                         "bfloat16, float32"):
        ModelSpec.from_config(_cfg("auto", ("rope", "rope"), dtype="float16"))


# ---------------------------------------------------------------- bf16 compute policy

FLOAT32_ONLY = ("exp", "exp2", "log", "log1p", "sin", "cos", "rsqrt", "sqrt", "reduce_max",
                "logistic")


@pytest.mark.parametrize("impl", ["blocked", "pallas"])
def test_bf16_compute_keeps_statistics_float32_and_matmuls_bf16(impl):
    """Traced forward + backward of a bf16 model (RoPE, ALiBi, T5, KERPLE, FIRE layers, RMS norm
    and QK-norm): exponentials and logs (softmax, loss), norm rsqrt, RoPE sin / cos and row
    maxima take float32 inputs; parameters and their gradients are float32. With the fused
    kernel every matmul multiplies bf16 by bf16 (float32 accumulation) except the output
    head's backward, whose cotangent is the float32 logits' (vocabulary-sized operands). The
    XLA paths' backward multiplies float32 logit cotangents by bf16 q and k, so their matmul
    check is left out."""
    kinds = ("rope", "alibi", "t5", "kerple_log", "fire")
    model = _model(impl, kinds, dtype="bfloat16", attention_block=4, vocab_size=24,
                   norm=dict(kind="rms", qk_norm="rms"))  # 24: no other operand dim
    vocab = model.vocab_size
    loss, params = _loss_fn(model, helpers.tokens(B, L))
    fn = jax.value_and_grad(loss, has_aux=True)
    eqns = list(_primitives(jax.make_jaxpr(fn)(params).jaxpr))
    names = {e.primitive.name for e in eqns}
    assert {"exp", "sin", "cos", "rsqrt", "dot_general"} <= names, names
    assert ("pallas_call" in names) == (impl == "pallas")
    for e in eqns:
        avals = [v.aval for v in e.invars if hasattr(v, "aval")
                 and jnp.issubdtype(v.aval.dtype, jnp.floating)]
        dtypes = [a.dtype for a in avals]
        if e.primitive.name in FLOAT32_ONLY:
            assert all(d == jnp.float32 for d in dtypes), (e.primitive.name, dtypes)
        if e.primitive.name == "dot_general" and impl == "pallas":
            head = any(a.shape[-1] == vocab for a in avals)
            assert head or all(d == jnp.bfloat16 for d in dtypes), e
    grads = jax.eval_shape(fn, params)[1]
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params))
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(grads))


# ---------------------------------------------------------------- compiled kernels (GPU / TPU)

@accelerator
def test_accelerator_auto_model_matches_the_xla_path_in_bf16():
    """Compiled kernel ("auto" on the accelerator) vs the XLA dense path, same bf16 model,
    length 512: logits and parameter gradients within bf16 accuracy."""
    tokens = jax.random.randint(jax.random.key(0), (2, 512), 0, 64)
    results = {}
    for impl in ("dense", "auto"):
        model = _perturbed(_model(impl, dtype="bfloat16", d_model=128, vocab_size=64,
                                  train_length=512), scale=0.02)
        loss, params = _loss_fn(model, tokens)
        (_, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
        results[impl] = (logits, grads)
        if impl == "auto":
            text = jax.jit(loss).lower(params).as_text()
            assert "posenc_flash_fwd" in text
    (lg_d, g_d), (lg_a, g_a) = results["dense"], results["auto"]
    scale = float(jnp.abs(lg_d).max())
    assert float(jnp.abs(lg_a - lg_d).max()) < 0.03 * scale
    for want, got in zip(jax.tree.leaves(g_d), jax.tree.leaves(g_a), strict=True):
        err = float(jnp.abs(got - want).max())
        assert err <= 0.05 * float(jnp.abs(want).max()) + 1e-3, err


@accelerator
@pytest.mark.parametrize("kinds,fields", [
    (("rope", "alibi"), {"attention_sinks": "learned"}),  # gpt-oss sinks in the kernel's normalizer
    (("rope", "alibi"), {"attention_sinks": "zero"}),
    (("pope", "pope"), {}),  # q, k wider than v (PoPE's polar features)
    (("rope", "t5"), {"attention_gate": "elementwise"}),  # the output gate after the kernel
])
def test_accelerator_kernel_with_the_2025_attention_forms_matches_the_xla_path(kinds, fields):
    """The compiled kernel with learned / zero sinks, PoPE's narrower values and the output gate
    against the XLA dense path, same bf16 model, length 256: logits within bf16 accuracy."""
    tokens = jax.random.randint(jax.random.key(1), (2, 256), 0, 64)
    logits = {}
    for impl in ("dense", "auto"):
        model = _perturbed(_model(impl, kinds, dtype="bfloat16", d_model=128, vocab_size=64, train_length=256,
                                  **fields), scale=0.02)
        graphdef, state = nnx.split(model)
        fwd = jax.jit(lambda s, t, g=graphdef: nnx.merge(g, s)(t))
        if impl == "auto":
            assert "posenc_flash_fwd" in fwd.lower(state, tokens).as_text()
        logits[impl] = fwd(state, tokens)
    scale = float(jnp.abs(logits["dense"]).max())
    assert float(jnp.abs(logits["auto"] - logits["dense"]).max()) < 0.03 * scale


@accelerator
def test_accelerator_dtype_auto_resolves_to_bfloat16():
    spec = ModelSpec.from_config(_cfg("auto", ("rope", "rope"), dtype="auto"), train_length=16)
    assert spec.dtype == "bfloat16"


@accelerator
def test_accelerator_cached_decoding_with_compiled_kernels():
    kinds = ("alibi", "t5")
    tokens = helpers.tokens(B, 40)
    model = _perturbed(_model("auto", kinds, train_length=64))
    graphdef, state = nnx.split(model)
    dense, dense_state = nnx.split(_perturbed(_model("dense", kinds, train_length=64)))
    full = jax.jit(lambda s, t: nnx.merge(dense, s)(t))(dense_state, tokens)
    step = jax.jit(lambda state, t, cache: nnx.merge(graphdef, state).decode(t, cache))
    cache = model.init_cache(B, 64)
    logits, cache = step(state, tokens[:, :32], cache)
    outs = [logits]
    for i in range(32, 40):
        logits, cache = step(state, tokens[:, i:i + 1], cache)
        outs.append(logits)
    got = jnp.concatenate(outs, axis=1)
    # float32 on the GPU: Triton may multiply in TF32
    np.testing.assert_allclose(got, full, rtol=2e-2, atol=2e-2)
