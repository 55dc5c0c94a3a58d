"""Causality through gradients, and permutation (in)equivariance."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posenc.model import REGISTRY, Decoder
from posenc.model.config import model_config

L, D = 8, 32


def small_config(kind, **model):
    c = model_config()
    c.vocab_size, c.d_model, c.num_layers, c.num_heads, c.num_kv_heads = 16, D, 2, 4, 2
    c.position.kind, c.position.original_length, c.position.nope_every = kind, 4, 2
    c.update(model)
    return c


def _x(seed=0, length=L):
    return jax.random.normal(jax.random.key(seed), (2, length, D))


@pytest.mark.parametrize("kind", sorted(REGISTRY))
def test_output_at_i_does_not_depend_on_inputs_after_i(kind):
    # The blocked path with a block (3) that does not divide L; blocked == dense elsewhere.
    cfg = small_config(kind, attention_impl="blocked", attention_block=3)
    g, state = nnx.split(Decoder(cfg, rngs=nnx.Rngs(0)))
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
    model = Decoder(small_config(kind, num_layers=1), rngs=nnx.Rngs(0))
    x = _x(1, length=6)
    perm = jnp.array([3, 0, 5, 1, 4, 2])
    out = model.forward_embeddings(x, causal=causal)
    out_perm = model.forward_embeddings(x[:, perm], causal=causal)
    return float(jnp.abs(out_perm - out[:, perm]).max())


def test_nope_without_causal_mask_is_permutation_equivariant():
    assert _permutation_gap("nope", causal=False) < 1e-5


def test_nope_with_causal_mask_is_not_permutation_equivariant():
    assert _permutation_gap("nope", causal=True) > 1e-3


@pytest.mark.parametrize("kind", sorted(set(REGISTRY) - {"nope"}))
def test_every_encoding_breaks_permutation_equivariance(kind):
    assert _permutation_gap(kind, causal=False) > 1e-4
