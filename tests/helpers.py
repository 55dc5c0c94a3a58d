"""Small models for tests: configs of one encoding kind, specs with the training length filled in."""

import jax
import jax.numpy as jnp
from flax import nnx

from posenc.model import ENCODINGS, Decoder, ModelSpec, conformance, model_config

# The library's conformance building blocks (posenc.model.conformance), shared by the tests.
decode_stepwise = conformance.decode_stepwise
perturb_params = conformance.perturb_params

TRAIN_LENGTH = 16  # fills options that take the training length (RoPE original_length, table rows)


def model_cfg(kind="rope", *, position=None, norm=None, **model):
    """``config.model`` with ``kind`` and small sizes; ``position`` sets options of ``kind``'s section.

    iRoPE layers default to a NoPE layer every 2nd layer so that 2-layer models have one.
    """
    c = model_config()
    c.update(vocab_size=16, d_model=32, num_layers=2, num_heads=4)
    c.position.kind = kind
    opts = dict(position or {})
    if kind == "irope":
        opts.setdefault("nope_every", 2)
    if opts:
        c.position[kind].update(opts)
    if norm:
        c.norm.update(norm)
    c.update(model)
    return c


def spec(kind="rope", *, train_length=TRAIN_LENGTH, **kw) -> ModelSpec:
    return ModelSpec.from_config(model_cfg(kind, **kw), train_length=train_length)


def decoder(kind="rope", *, seed=0, train_length=TRAIN_LENGTH, perturb=0.0, **kw) -> Decoder:
    """A Decoder of ``kind``; ``perturb`` > 0 adds N(0, perturb^2) noise to every parameter, so that
    zero-initialised position parameters (CoPE embeddings, ReZero gates) take part in tests."""
    model = Decoder(spec(kind, train_length=train_length, **kw), rngs=nnx.Rngs(seed))
    if perturb:
        perturb_params(model, jax.random.key(seed + 1000), perturb)
    return model


def attention_kinds():
    """Every registered kind that acts inside attention (input-embedding kinds are NoPE there)."""
    return sorted(k for k, cls in ENCODINGS.items() if not cls.acts_at_input())


def tokens(batch=2, length=12, vocab=16, seed=0):
    return jax.random.randint(jax.random.key(seed), (batch, length), 0, vocab, jnp.int32)


def decode_in_pieces(model, tokens, first, max_length):
    """One jit: the full forward, a decode of tokens[:, :first] then the rest (and the cache),
    and the full forward at shifted positions 77 + 3 i."""
    g, state = nnx.split(model)

    @jax.jit
    def run(state, tokens):
        m = nnx.merge(g, state)
        out, cache = conformance.decode_in_pieces(m, tokens, (first,), max_length)
        return (m(tokens), out[:, :first], out[:, first:], cache,
                m(tokens, 77 + 3 * jnp.arange(tokens.shape[1])))

    return run(state, tokens)
