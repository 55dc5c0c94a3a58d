"""The benchmarks' workload: a case's config per position, its model, fresh train state, random
tokens (the peer's workload), FLOPs per token and the loop's calls of k steps.

Shared by benchmarks.benchmark, benchmarks.bench_profile and benchmarks.bench_threads.
"""

from __future__ import annotations

import dataclasses
import functools


def config_for(config, position: str):
    import copy

    c = copy.deepcopy(config)
    with c.unlocked():
        c.model.position.kind = position
    return c


def spec(c):
    """The model spec; options that take the training length (a learned table's rows) cover the eval lengths."""
    from posenc.model import ModelSpec

    longest = max(int(c.task.train_length), *(int(n) for n in c.bench.eval_lengths or (0,)))
    return ModelSpec.from_config(c.model, train_length=longest)


class RandomTokens:
    """Uniform random tokens, every position a target: the peer's workload (made by :class:`RandomTokensSpec`)."""

    name = "random"

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def batch(self, key, batch_size, length, *, min_size=None, split="train"):
        import jax
        import jax.numpy as jnp

        x = jax.random.randint(key, (batch_size, length + 1), 0, self.vocab_size, jnp.int32)
        return {"inputs": x[:, :-1], "targets": x[:, 1:], "mask": jnp.ones((batch_size, length), jnp.float32)}


@dataclasses.dataclass(frozen=True)
class RandomTokensSpec:
    """The task spec of :class:`RandomTokens` (a train spec's ``task``: hashable, with ``make``)."""

    vocab_size: int

    def make(self):
        return _random_tokens(self.vocab_size)


@functools.cache
def _random_tokens(vocab_size: int):
    return RandomTokens(vocab_size)


def train_spec(c):
    """The train step's spec of a benchmark config: its train fields, on :class:`RandomTokens`."""
    from posenc.training import specs

    return specs.TrainSpec.from_config(c, RandomTokensSpec(int(c.model.vocab_size)))


def build(config):
    from flax import nnx

    from posenc.model import Decoder

    return Decoder(spec(config), rngs=nnx.Rngs(0))


def flops_per_token(model, config) -> float:
    import jax
    from flax import nnx

    params = nnx.state(model, nnx.Param)
    n = sum(x.size for x in jax.tree.leaves(params))
    m = config.model
    n -= m.vocab_size * m.d_model * (1 if m.tie_embeddings else 2)
    return 6.0 * n + 12.0 * m.num_layers * m.d_model * int(config.task.train_length)


def fresh_state(c):
    from flax import nnx

    from posenc.training import optim

    model = build(c)
    optimizer = nnx.Optimizer(model, optim.make_optimizer(train_spec(c).optimizer), wrt=nnx.Param)
    graphdef, state = nnx.split((model, optimizer))
    return model, graphdef, state


class Chunks:
    """Train steps in calls of ``k`` (posenc.training.step.train_chunk_fn, as the loop runs them)."""

    def __init__(self, c, buffer):
        import jax

        from posenc.training import step as step_lib

        self.fn = step_lib.train_chunk_fn(train_spec(c), buffer)
        self.root, self.t = jax.random.key(0), 0

    def __call__(self, graphdef, state, n):
        import numpy as np

        state, metrics = self.fn(graphdef, state, self.root, np.int32(self.t), np.int32(n))
        self.t += n
        return state, metrics


def steps_per_call(c, chunks, graphdef, state):
    """``bench.steps_per_call`` (an int), or the loop's "auto" rule (its probe calls of 1 and 2 steps)."""
    import jax

    from posenc.training import steploop

    k = c.bench.steps_per_call
    if k != "auto":
        return int(k), state
    box = [state]

    def call(n):
        box[0], m = chunks(graphdef, box[0], n)
        jax.block_until_ready(m)

    k = steploop.probe_steps_per_call(call)
    return k, box[0]
