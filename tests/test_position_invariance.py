"""Encodings that are relative in theory, at the pure-function level: logits / biases at
positions p and p + c agree for c up to 10^6 and beyond (2^30), with batch dims, Lq != Lk and
non-contiguous positions.

- exact in integers (ALiBi, T5, KERPLE, Shaw, FIRE below its threshold): bitwise equal;
- rotary (RoPE, xPos through apply_pair, Transformer-XL): within 1e-4 for unit-scale q, k,
  thanks to the range-reduced angles (the canonical float32 angles drift past 1e-4 at 10^6);
- bf16 RoPE: each logit within 2^-7 |q| |k| of the exact one at any offset (two bf16 roundings);
- through the decoder: every unit that declares ``relative`` (dense and blocked attention), by
  ``posenc.model.check_encoding`` in tests/test_conformance.py;
- FIRE: not shift invariant by design (max(i, L) normaliser); invariant are its distance
  term log(|c (i - j)| + 1) and the whole bias while every query stays below L.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posenc import alibi, fire, kerple, rope, shaw, t5, transformer_xl, xpos
from posenc.model import ENCODINGS

SHIFTS = [1, 4097, 65_536, 10**6, -(10**6), 2**30]
H, DH = 2, 16
RNG = np.random.default_rng(0)
QP = jnp.array([[3, 40, 41], [7, 9, 300]])  # [B, Lq]: gaps, Lq != Lk
KP = jnp.array([[0, 1, 3, 20, 41], [2, 7, 8, 9, 250]])  # [B, Lk]


def unit(shape, seed):
    x = np.random.default_rng(seed).normal(size=shape)
    return jnp.asarray(x / np.linalg.norm(x, axis=-1, keepdims=True), jnp.float32)


Q, K = unit((2, 3, H, DH), 1), unit((2, 5, H, DH), 2)


def dot(q, k):
    return jnp.einsum("...qhd,...khd->...hqk", q.astype(jnp.float32), k.astype(jnp.float32), precision="highest")


def assert_invariant(f, *, atol, shifts=SHIFTS):
    base = np.asarray(f(QP, KP))
    assert np.isfinite(base).all()
    for c in shifts:
        shifted = np.asarray(f(QP + c, KP + c))
        if atol == 0:
            np.testing.assert_array_equal(shifted, base, err_msg=f"shift {c}")
        else:
            np.testing.assert_allclose(shifted, base, rtol=0, atol=atol, err_msg=f"shift {c}")


# ----------------------------------------------------------------- rotary


@pytest.mark.parametrize("layout", rope.LAYOUTS)
@pytest.mark.parametrize("kind, kw", [("default", {}), ("yarn", dict(factor=8.0, original_length=32))])
def test_rope(kind, kw, layout):
    inv, af = rope.frequencies(kind, DH, **kw)

    @jax.jit
    def f(qp, kp):
        return dot(rope.apply(Q, qp, inv, layout=layout, attention_factor=af),
                   rope.apply(K, kp, inv, layout=layout, attention_factor=af))

    assert_invariant(f, atol=1e-4 * af**2)


def test_rope_canonical_angles_drift():
    inv, _ = rope.frequencies("default", DH)
    f = jax.jit(lambda qp, kp: dot(rope.apply(Q, qp, inv, angles="canonical"),
                                   rope.apply(K, kp, inv, angles="canonical")))
    with pytest.raises(AssertionError):
        assert_invariant(f, atol=1e-4, shifts=[10**6])


@pytest.mark.parametrize("angles, holds", [("exact", True), ("canonical", False)])
def test_rope_bf16_bound(angles, holds):
    # Each bf16 logit is within 2^-7 |q| |k| of the exact logit <q, R_{n-m} k> of the bf16
    # inputs (each rotated element is the exact rotation rounded to bf16 once: 2^-8 relative),
    # at any offset; so a shift moves it by at most 2^-6 |q| |k|.
    inv, _ = rope.frequencies("default", DH)
    qb, kb = unit((2, 64, H, DH), 3).astype(jnp.bfloat16), unit((2, 64, H, DH), 4).astype(jnp.bfloat16)
    pos = jnp.asarray(np.sort(RNG.choice(5000, size=(2, 64), replace=False), -1))
    f = jax.jit(lambda p: dot(rope.apply(qb, p, inv, angles=angles), rope.apply(kb, p, inv, angles=angles)))
    qs, ks = (np.asarray(v.astype(jnp.float32), np.float64) for v in (qb, kb))
    t = (np.asarray(pos)[:, None, None, :] - np.asarray(pos)[:, None, :, None])[..., None] * np.asarray(inv, np.float64)
    qa, qc, ka, kc = qs[..., :8], qs[..., 8:], ks[..., :8], ks[..., 8:]  # "half" pairs (j, j + 8)
    qa, qc = (np.moveaxis(v, 1, 2)[:, :, :, None] for v in (qa, qc))  # [B, H, Lq, 1, 8]
    ka, kc = (np.moveaxis(v, 1, 2)[:, :, None] for v in (ka, kc))  # [B, H, 1, Lk, 8]
    exact = np.sum(qa * (ka * np.cos(t) - kc * np.sin(t)) + qc * (kc * np.cos(t) + ka * np.sin(t)), -1)
    norms = (np.linalg.norm(qs, axis=-1).transpose(0, 2, 1)[..., :, None]
             * np.linalg.norm(ks, axis=-1).transpose(0, 2, 1)[..., None, :])
    worst = max((np.abs(np.asarray(f(pos + c)) - exact) / norms).max() for c in (0, 65_536, 10**5, 10**6))
    assert (worst <= 2.0**-7) == holds, worst


def test_xpos_pair():
    inv, _ = rope.frequencies("default", DH)

    @jax.jit
    def f(qp, kp):
        q, k = xpos.apply_pair(Q, K, qp, kp, inv, scale_base=64.0)
        return dot(q, k)

    assert_invariant(f, atol=1e-4)  # the offset moves with the positions: only the rotation differs

    # decoding: one query after 4,000 cached keys, at offsets up to 2^30
    kp = jnp.arange(4000)[None]
    kk = unit((1, 4000, H, DH), 5)

    @jax.jit
    def g(qp, kp):
        q, k = xpos.apply_pair(Q[:1, :1], kk, qp, kp, inv)
        return dot(q, k)

    base = np.asarray(g(jnp.array([[3999]]), kp))
    for c in SHIFTS[1:]:
        np.testing.assert_allclose(g(jnp.array([[3999 + c]]), kp + c), base, rtol=0, atol=1e-4)


@pytest.mark.parametrize("contiguous", [False, True])
def test_transformer_xl(contiguous):
    u, v = (unit((H, DH), s) for s in (6, 7))
    w_r = jnp.asarray(RNG.normal(size=(8, H, DH)) / np.sqrt(8), jnp.float32)
    qp, kp = (QP, KP) if not contiguous else (jnp.array([[4, 5, 6], [9, 10, 11]]),
                                              jnp.arange(5)[None] + jnp.array([[2], [7]]))

    @jax.jit
    def f(a, b):
        return transformer_xl.logits(Q, K, a, b, u=u, v=v, w_r=w_r, contiguous=contiguous)

    base = np.asarray(f(qp, kp))
    assert np.isfinite(base).all()
    for c in SHIFTS:
        np.testing.assert_allclose(f(qp + c, kp + c), base, rtol=0, atol=1e-4, err_msg=f"shift {c}")


# ------------------------------------------------------- integer-exact biases


def test_alibi():
    s = alibi.slopes(4)
    assert_invariant(lambda a, b: alibi.bias(a, b, s), atol=0)
    assert_invariant(lambda a, b: alibi.bias(a, b, s, causal=False), atol=0)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_t5(bidirectional):
    table = jnp.asarray(RNG.normal(size=(32, H)), jnp.float32)
    assert_invariant(lambda a, b: t5.bias(a, b, table, bidirectional=bidirectional), atol=0)


@pytest.mark.parametrize("kind", kerple.KINDS)
def test_kerple(kind):
    a, p = jnp.array([0.3, 1.2]), jnp.array([0.9, 1.7])
    assert_invariant(lambda x, y: kerple.bias(x, y, a, p, kind=kind), atol=0)


def test_shaw():
    tk, tv = (jnp.asarray(RNG.normal(size=(2 * 8 + 1, DH)), jnp.float32) for _ in range(2))
    w = jax.nn.softmax(jnp.asarray(RNG.normal(size=(2, H, 3, 5)), jnp.float32), -1)
    assert_invariant(lambda a, b: shaw.logits(Q, tk, a, b, max_distance=8), atol=0)
    assert_invariant(lambda a, b: shaw.values(w, tv, a, b, max_distance=8), atol=0)


# ------------------------------------------------------------------- FIRE


def test_fire_invariant_below_threshold_and_in_its_distance_term():
    params = fire.init_params(jax.random.key(0), H, hidden=8)
    f = functools.partial(fire.bias, params=params)  # threshold 512: every query below it
    assert_invariant(lambda a, b: f(a, b), atol=0, shifts=[1, 50, 200])
    # Distance term log(|c (i - j)| + 1) = input * (normaliser + eps): shift invariant at any offset.
    c, thr = params["c"], fire.effective_threshold(params)

    def distance_term(a, b):
        norm = jnp.log(jnp.abs(c * jnp.maximum(a.astype(jnp.float32), thr)) + 1) + 1e-6
        return fire.inputs(a, b, c, thr) * norm[..., :, None]

    assert_invariant(distance_term, atol=1e-5 * float(jnp.max(distance_term(QP, KP))))


def test_fire_is_not_shift_invariant_past_its_threshold():
    # By design (progressive interpolation): past L the input is psi(i - j) / psi(i).
    params = fire.init_params(jax.random.key(0), H, hidden=8)
    base = fire.bias(QP, KP, params)
    moved = fire.bias(QP + 10**6, KP + 10**6, params)
    assert np.abs(np.asarray(moved - base)).max() > 1e-3
    x = fire.inputs(QP + 10**6, KP + 10**6, params["c"], fire.effective_threshold(params))
    assert float(jnp.max(x)) < 0.5  # every distance here is small next to 10^6


# ----------------------------------------------------------------- through the decoder

RELATIVE = sorted(k for k, cls in ENCODINGS.items() if cls.relative)
DECODER_SHIFTS = (4097, 10**6)


def test_the_relative_declarations_are_the_encodings_relative_in_theory():
    # sinusoidal / learned read absolute positions; FIRE's normaliser max(i, L) does too.
    assert {"sinusoidal", "learned", "fire"}.isdisjoint(RELATIVE)
    assert {"rope", "irope", "xpos", "alibi", "t5", "shaw", "transformer_xl", "kerple_log", "kerple_power",
            "cope", "nope", "fox", "stickbreaking", "path", "path_fox", "abacus"} <= set(RELATIVE)


# Through the decoder: the logits of every unit declaring ``relative``, dense and blocked, at
# positions moved by 4097 and 10^6 equal those at 0..L-1 within 1e-4 -- the "shift invariance"
# check of posenc.model.check_encoding, run over the registry by tests/test_conformance.py.
