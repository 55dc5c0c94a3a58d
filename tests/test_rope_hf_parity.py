"""posenc.rope.frequencies against HuggingFace transformers on 587 random configurations.

The fixture (tests/data/hf_rope_frequencies.*) holds HF's own inv_freq and
attention factor for random kinds, head dims, partial rotary fractions,
bases, factors, original lengths, sequence lengths, YaRN betas / truncate /
mscale pairs / explicit attention factors, LongRoPE factor lists and Llama 3
low / high frequency factors; tests/data/make_hf_rope_fixture.py makes it.
"""

import json
import os

import numpy as np
import pytest

from posenc import rope

HERE = os.path.join(os.path.dirname(__file__), "data")
with open(os.path.join(HERE, "hf_rope_frequencies.json")) as f:
    CASES = json.load(f)
HF = np.load(os.path.join(HERE, "hf_rope_frequencies.npz"))

# float32 agreement: HF's torch pow is within an ulp of a correctly rounded
# one; the Llama 3 smoothing band (L / wavelength - a) amplifies one ulp of
# inv_freq by up to ~40x, in HF as here.
RTOL = {"llama3": 5e-6}


@pytest.mark.parametrize("kind", sorted({c["kind"] for c in CASES}))
def test_frequencies_match_huggingface(kind):
    checked = 0
    for i, case in enumerate(CASES):
        if case["kind"] != kind:
            continue
        inv_freq, attention_factor = rope.frequencies(kind, case["d"], **case["kw"])
        np.testing.assert_allclose(np.asarray(inv_freq), HF[str(i)], rtol=RTOL.get(kind, 3e-7), atol=0,
                                   err_msg=f"case {i}: {case}")
        assert float(attention_factor) == pytest.approx(case["af"], rel=1e-12), case
        checked += 1
    assert checked >= 50
