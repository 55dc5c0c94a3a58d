"""Causality through gradients, and permutation (in)equivariance."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import helpers
from posenc.model import ENCODINGS

L, D = 8, 32
REGISTRY = ENCODINGS


def small_model(kind, **model):
    # perturbed parameters: zero-initialised ones (CoPE's embeddings) take part as well
    return helpers.decoder(kind, num_kv_heads=2, train_length=2 * L, perturb=0.05, **model)


def _x(seed=0, length=L):
    return jax.random.normal(jax.random.key(seed), (2, length, D))


@pytest.mark.parametrize("kind", sorted(REGISTRY))
def test_output_at_i_does_not_depend_on_inputs_after_i(kind):
    # The blocked path with a block (3) that does not divide L; blocked == dense elsewhere.
    g, state = nnx.split(small_model(kind, attention_impl="blocked", attention_block=3))
    positions = 2 + jnp.arange(L)

    @jax.jit
    def grad_at(state, x, i):
        f = lambda x: nnx.merge(g, state).forward_embeddings(x, positions)  # noqa: E731
        logits, vjp = jax.vjp(f, x)
        cot = jnp.zeros_like(logits).at[:, i].set(1.0)
        return vjp(cot)[0]

    x = _x()
    for i in range(L):
        norms = np.asarray(jnp.abs(grad_at(state, x, i)).sum(axis=(0, 2)))  # [L]
        assert np.all(norms[i + 1:] == 0.0), (i, norms)
        assert np.all(norms[: i + 1] > 0.0), (i, norms)


def _permutation_gap(kind, *, causal):
    model = small_model(kind, num_layers=1)
    x = _x(1, length=6)
    perm = jnp.array([3, 0, 5, 1, 4, 2])
    # token ids behind x, for units that read them (Abacus: runs of the digit ids 4-13)
    tokens = jnp.array([[5, 6, 7, 1, 8, 9]] * 2)
    out = model.forward_embeddings(x, causal=causal, tokens=tokens)
    out_perm = model.forward_embeddings(x[:, perm], causal=causal, tokens=tokens[:, perm])
    return float(jnp.abs(out_perm - out[:, perm]).max())


def test_nope_without_causal_mask_is_permutation_equivariant():
    assert _permutation_gap("nope", causal=False) < 1e-5


def test_nope_with_causal_mask_is_not_permutation_equivariant():
    assert _permutation_gap("nope", causal=True) > 1e-3


@pytest.mark.parametrize("kind", sorted(set(REGISTRY) - {"nope"}))
def test_every_encoding_breaks_permutation_equivariance(kind):
    assert _permutation_gap(kind, causal=False) > 1e-4
