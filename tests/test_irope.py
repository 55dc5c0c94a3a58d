import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posenc import irope


def test_nope_temperature_values():
    pos = jnp.array([0, 8190, 8191, 16383, 100000])
    want = [1.0, 1.0, 1 + 0.1 * math.log(2), 1 + 0.1 * math.log(3), 1 + 0.1 * math.log(math.floor(100001 / 8192) + 1)]
    out = irope.nope_temperature(pos)
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(out, want, rtol=1e-6)
    np.testing.assert_allclose(
        irope.nope_temperature(jnp.array([9]), floor_scale=4.0, attn_scale=0.5), [1 + 0.5 * math.log(3)], rtol=1e-6
    )


def test_nope_temperature_batch_jit():
    pos = jnp.array([[0, 20000], [40000, 5]])
    out = jax.jit(irope.nope_temperature)(pos)
    assert out.shape == (2, 2)
    np.testing.assert_allclose(out, jax.vmap(irope.nope_temperature)(pos), rtol=1e-7)
    assert float(out[1, 0]) > float(out[0, 1]) > 1.0


def test_nope_temperature_errors():
    with pytest.raises(ValueError, match="integer array"):
        irope.nope_temperature(jnp.array([1.0]))
    with pytest.raises(ValueError, match="floor_scale must be a finite number > 0; got 0.0"):
        irope.nope_temperature(jnp.array([1]), floor_scale=0.0)


def test_layer_kinds():
    assert irope.layer_kinds(12) == ("rope",) * 3 + ("nope",) + ("rope",) * 3 + ("nope",) + ("rope",) * 3 + ("nope",)
    kinds = irope.layer_kinds(7, nope_every=3, rope_kind="xpos")
    assert [i for i, k in enumerate(kinds) if k == "nope"] == [2, 5]
    assert set(kinds) == {"nope", "xpos"}
    assert irope.layer_kinds(3, nope_every=1) == ("nope",) * 3
    assert irope.layer_kinds(3, nope_every=10) == ("rope",) * 3
    assert irope.layer_kinds(0) == ()


@pytest.mark.parametrize(
    "args, kwargs, match",
    [
        ((4,), dict(nope_every=0), "nope_every must be >= 1"),
        ((4,), dict(nope_every=-2), "nope_every must be >= 1"),
        ((-1,), {}, "num_layers must be >= 0"),
        ((4.0,), {}, "num_layers must be an integer"),
        ((4,), dict(rope_kind="nope"), "rope_kind"),
    ],
)
def test_layer_kinds_errors(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        irope.layer_kinds(*args, **kwargs)
