"""posenc.model.check_encoding: every registered encoding conforms; wrong plugins are caught, each
failed check named in one report.

The registry-wide run is the one test of these properties for every unit (it replaced per-kind
copies in test_decode, test_causality and test_position_invariance): dense == blocked (values and
gradients), cached decoding token by token and in pieces == the full forward, shift invariance of
every unit declaring ``relative``, causality through gradients, finite gradients reaching every
parameter of the unit, jit and vmap. Encodings are paired with norm placements, norm kinds,
attention sinks and output gates in turn, so every placement, norm, sink and gate decodes too.
"""

import itertools
import re

import jax.numpy as jnp
import pytest
from flax import nnx

import posenc
from posenc import norm_names, placements
from posenc.model import ENCODINGS, Encoding, EncodingCheckError, check_encoding, conformance
from posenc.model import config as model_config
from posenc.model import spec as model_spec
from posenc.model.registry import read_options

_PLACEMENTS = itertools.cycle(norm_names.PLACEMENTS)
_NORMS = itertools.cycle(norm_names.NORM_KINDS)
# attention sinks join a softmax: units with their own weights take none
_SINKS = itertools.cycle(model_config.SINKS)
_GATES = itertools.cycle(("none", *model_config.GATES))  # every other unit gated


def _placement(kind):
    """The next placement of the cycle that takes ``kind``: nGPT normalises q and k, which a unit that
    counter-scales them (xPos) refuses (Encoding.counter_scales_qk)."""
    refused = ENCODINGS[kind].counter_scales_qk(read_options(kind, None))
    return next(p for p in _PLACEMENTS if not (refused and placements.PLACEMENTS[p].sphere))


CASES = [(kind, _placement(kind), next(_NORMS),
          "none" if ENCODINGS[kind].own_attention() else next(_SINKS), next(_GATES))
         for kind in sorted(ENCODINGS)]  # plugins included
OPTIONS = {"irope": dict(nope_every=2)}  # a NoPE layer among the 2


def test_cases_cover_every_encoding_placement_norm_sink_and_gate():
    assert [c[0] for c in CASES] == sorted(ENCODINGS)
    assert {c[1] for c in CASES} == set(norm_names.PLACEMENTS)
    assert {c[2] for c in CASES} == set(norm_names.NORM_KINDS)
    assert {c[3] for c in CASES} == set(model_config.SINKS)
    assert {c[4] for c in CASES} == set(model_config.GATES)


@pytest.mark.parametrize("kind,placement,norm,sinks,gate", CASES)
def test_every_registered_encoding_passes_check_encoding(kind, placement, norm, sinks, gate):
    model = dict(norm=dict(placement=placement, kind=norm), attention_sinks=sinks, attention_gate=gate)
    # what the placement needs beside it (nGPT: its SwiGLU MLP)
    model.update({f.split(".", 1)[1]: v for f, v in model_spec.placement_fields(placement).items()
                  if f.count(".") == 1})
    summary = check_encoding(kind, model=model, **OPTIONS.get(kind, {}))
    assert list(summary) == list(conformance.CHECKS)
    skipped = {c for c, s in summary.items() if s.startswith("skipped")}
    # nGPT's s_qk scales the rotated q, k per dimension: no shift invariance to check
    assert skipped == (set() if ENCODINGS[kind].relative and placement != "ngpt" else {"shift invariance"}), summary
    assert all(s.startswith("passed") for c, s in summary.items() if c not in skipped), summary


class AbsoluteSlope(Encoding):
    """Declares relative = True, but its distance bias is divided by the absolute query position
    (as FIRE's normaliser): moving every position changes the logits."""

    relative = True

    def bias(self, q_positions, k_positions):
        q = q_positions[..., None, :, None].astype(jnp.float32)
        k = k_positions[..., None, None, :].astype(jnp.float32)
        return -(q - k) / (1.0 + q) * jnp.ones((self.num_heads, 1, 1))


def test_a_relative_plugin_reading_absolute_positions_fails_shift_invariance_alone():
    before = dict(ENCODINGS)
    with pytest.raises(EncodingCheckError) as info:
        check_encoding(AbsoluteSlope)
    err = info.value
    assert set(err.failures) == {"shift invariance"}, str(err)
    message = str(err)
    assert message.startswith("encoding 'unregistered_absoluteslope' failed 1 of 7 conformance checks")
    line = next(x for x in message.splitlines() if "shift invariance" in x)
    assert line.split()[0] == "FAIL" and "declares relative = True" in line and "+ 4097" in line
    assert sum(x.split()[0] == "passed" for x in message.splitlines()[1:]) == 6
    assert ENCODINGS == before and AbsoluteSlope.name == ""  # registered for the call only


class Careless(Encoding):
    """One mistake per check: keys scaled by the number of key slots (the cache's, when decoding),
    a bias scaled by the tile's keys and the batch of its positions, an absolute sine declared
    relative, an output that averages over later tokens, a parameter nothing reads."""

    relative = True

    def setup(self, rngs, first):
        self.unused = nnx.Param(jnp.ones((self.num_heads,)))

    def key(self, k, positions, *, seq_len):
        return k * (8.0 / k.shape[1])

    def bias(self, q_positions, k_positions):
        q = q_positions[..., None, :, None].astype(jnp.float32)
        k = k_positions[..., None, None, :].astype(jnp.float32)
        tile = k_positions.shape[-1] * q_positions.shape[0]
        return jnp.sin(0.3 * k) - (q - k) / tile + jnp.zeros((self.num_heads, 1, 1))

    def output(self, out, features):
        return out + out.mean(axis=1, keepdims=True)


def test_one_report_lists_every_failed_check_with_what_failed():
    with pytest.raises(EncodingCheckError) as info:
        check_encoding(Careless)
    failures = info.value.failures
    assert set(failures) == set(conformance.CHECKS)
    lines = str(info.value).splitlines()
    assert len(lines) == 1 + len(conformance.CHECKS)
    assert all(x.split()[0] == "FAIL" for x in lines[1:])
    assert failures["dense == blocked"].startswith("blocked attention differs from dense")
    for check in ("cached decoding, token by token", "cached decoding, in pieces"):
        assert "logits differ from the full forward pass" in failures[check]
    assert "declares relative = True" in failures["shift invariance"]
    assert re.search(r"the output at \d+ depends on the input at \d+ > \d+", failures["causality"])
    assert "parameter ['blocks'][0]['attn']['encoding']['unused']" in failures["finite gradients"]
    assert "vmapped over the examples differs" in failures["jit and vmap"]


class Untraceable(Encoding):
    """Reads a concrete value of its positions: fails under jit, not eagerly."""

    def bias(self, q_positions, k_positions):
        return jnp.zeros((self.num_heads, 1, 1)) * float(k_positions.max())


def test_a_plugin_that_cannot_be_traced_is_reported_not_raised():
    with pytest.raises(EncodingCheckError) as info:
        check_encoding(Untraceable)
    failures = info.value.failures
    assert failures["jit and vmap"].startswith("raised ConcretizationTypeError")
    assert "shift invariance" not in failures  # skipped: not declared relative


def test_bad_options_and_arguments_fail_before_anything_runs():
    with pytest.raises(ValueError, match="model.position.t5"):
        check_encoding("t5", num_bucket=8)
    with pytest.raises(ValueError, match="encoding 'alibi' has no options; got slope"):
        check_encoding("alibi", slope=0.5)
    with pytest.raises(ValueError, match="unknown position kind 'alibj'"):
        check_encoding("alibj")
    with pytest.raises(TypeError, match="registered name or an Encoding subclass"):
        check_encoding(posenc.alibi)
