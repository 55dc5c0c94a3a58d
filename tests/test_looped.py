"""The looped transformer (model.recurrences) against McLeish et al. 2024's official forward pass.

mcleish7/arithmetic ``cramming/architectures/crammed_depthrecurrent.py``:
``ScriptableRecurrentLM.forward`` keeps the embeddings as ``injected_state``,
starts the hidden state from ``initialize_state`` (``state_init`` "zero":
zeros) and applies the recurrent block ``maximal_recurrence`` times;
``TransformerBlock.forward`` with ``input_injection_type`` "add" (the
default) adds the injected state, then runs its layers. Transcribed below
over the model's own embedding, blocks and head.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posenc.model import Decoder, ModelSpec, model_config


def _cfg(recurrences, **kw):
    c = model_config()
    c.update(vocab_size=16, d_model=32, num_layers=2, num_heads=4, recurrences=recurrences, **kw)
    c.position.kind = "abacus"
    return c


def official_forward(model, tokens, recurrences):
    """``ScriptableRecurrentLM.forward`` (state_init "zero", no steps without gradients) over ``model``'s parts."""
    B, L = tokens.shape
    positions = model._positions(None, B, L, shared=True)
    injected_state, _ = model._input(model.embed_tokens(tokens), positions, True, tokens=tokens)

    def layer(block, i, states):
        attend = lambda a, hin: (a.forward(hin, model._unit_positions(i + 1, positions), seq_len=L,  # noqa: E731
                                           causal=True, return_stats=False), None)
        return block(states, attend, deterministic=True)[0]

    def recurrent_block(states, injected_state):  # TransformerBlock.forward, injection_type "add"
        states = states + injected_state
        for i, block in enumerate(model.blocks):
            states = layer(block, i, states)
        return states

    hidden_states = jnp.zeros_like(injected_state)  # initialize_state: state_init "zero"
    for _ in range(recurrences):
        hidden_states = recurrent_block(hidden_states, injected_state)
    return model._output(hidden_states)


@pytest.mark.parametrize("recurrences", [1, 3])
def test_the_forward_pass_is_the_official_loop(recurrences):
    model = Decoder(_cfg(recurrences), rngs=nnx.Rngs(0))
    tokens = jax.random.randint(jax.random.key(1), (2, 11), 0, 16)
    np.testing.assert_allclose(np.asarray(model(tokens)), np.asarray(official_forward(model, tokens, recurrences)),
                               atol=2e-5)


def test_one_pass_is_the_plain_model_and_more_passes_share_its_weights():
    tokens = jax.random.randint(jax.random.key(2), (2, 9), 0, 16)
    plain = Decoder(ModelSpec.from_config(_cfg(1)), rngs=nnx.Rngs(0))
    looped = Decoder(ModelSpec.from_config(_cfg(4)), rngs=nnx.Rngs(0))
    sizes = lambda m: sorted(x.size for x in jax.tree.leaves(nnx.state(m, nnx.Param)))  # noqa: E731
    assert sizes(plain) == sizes(looped)
    assert not np.allclose(np.asarray(plain(tokens)), np.asarray(looped(tokens)))
    assert ModelSpec.from_config(model_config()).recurrences == 1


def test_cached_decoding_equals_the_forward_pass():
    model = Decoder(_cfg(3), rngs=nnx.Rngs(0))
    tokens = jax.random.randint(jax.random.key(3), (2, 9), 0, 16)
    cache = model.init_cache(2, 9)
    assert len(cache["k"]) == 2 * 3  # every pass its own entries
    out, cache = model.decode(tokens[:, :4], cache)
    outs = [out]
    for t in range(4, 9):
        out, cache = model.decode(tokens[:, t:t + 1], cache)
        outs.append(out)
    np.testing.assert_allclose(np.asarray(jnp.concatenate(outs, 1)), np.asarray(model(tokens)), atol=2e-5)


def test_stats_hold_each_blocks_largest_logit_over_its_passes():
    model = Decoder(_cfg(3), rngs=nnx.Rngs(0))
    _, stats = model(jax.random.randint(jax.random.key(4), (2, 7), 0, 16), return_stats=True)
    assert stats["max_logit_per_head"].shape == (2, 4)  # [num_layers, heads]


@pytest.mark.parametrize("fields,named", [({"residual_streams": 2}, "residual_streams=2"),
                                          ({"norm": {"placement": "ngpt"}}, "placement 'ngpt'")])
def test_combinations_without_a_hidden_state_to_add_to_are_refused(fields, named):
    c = _cfg(2)
    for k, v in fields.items():
        if isinstance(v, dict):
            c[k].update(v)
        else:
            c[k] = v
    with pytest.raises(ValueError, match=f"model.recurrences=2 adds the input embeddings.*{named}"):
        ModelSpec.from_config(c)
    c = _cfg(0)
    with pytest.raises(ValueError, match="model.recurrences"):
        ModelSpec.from_config(c)
