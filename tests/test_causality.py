"""Permutation (in)equivariance (causality through gradients: tests/test_conformance.py)."""

import jax
import jax.numpy as jnp
import pytest

import helpers
from posenc.model import ENCODINGS

L, D = 8, 32


def small_model(kind, **model):
    # perturbed parameters: zero-initialised ones (CoPE's embeddings) take part as well
    return helpers.decoder(kind, num_kv_heads=2, train_length=2 * L, perturb=0.05, **model)


def _x(seed=0, length=L):
    return jax.random.normal(jax.random.key(seed), (2, length, D))


# d logits_i / d x_j = 0 for j > i (and != 0 for j <= i), dense and blocked with a partial block,
# for every registered encoding: the "causality" check of posenc.model.check_encoding
# (tests/test_conformance.py).


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


@pytest.mark.parametrize("kind", sorted(set(ENCODINGS) - {"nope"}))
def test_every_encoding_breaks_permutation_equivariance(kind):
    assert _permutation_gap(kind, causal=False) > 1e-4
