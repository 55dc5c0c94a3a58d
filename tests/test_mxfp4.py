"""posenc.mxfp4 bit for bit against transformers' ``convert_moe_packed_tensors``.

- golden bits: transformers 5.18 (torch 2.13, CPU), ``convert_moe_packed_tensors(blocks, scales, dtype=...)``
  on the small tensor below, every corner of the format (overflow, subnormals, -0, the scale 255);
- a NumPy transcription of ``_convert_moe_packed_tensors`` (integrations/mxfp4.py) in float64,
  whose products are exact, on random bytes with every scale.
"""

import jax.numpy as jnp
import numpy as np
import pytest

from posenc import mxfp4

BLOCKS = np.array([[[[0x21, 0x7F]], [[0x80, 0xF9]], [[0x35, 0xC6]], [[0x10, 0x0E]], [[0x4B, 0xD2]], [[0x01, 0x87]],
                    [[0x77, 0xAA]], [[0x01, 0x80]]]], np.uint8)  # [E=1, rows=8, G=1, B=2]
SCALES = np.array([[[127], [128], [0], [1], [120], [254], [255], [255]]], np.uint8)
GOLDEN_BITS = {  # convert_moe_packed_tensors(BLOCKS, SCALES, dtype=...).view(int16 / int32): [1, 4, 8]
    "bfloat16": [[[16128, 0, 192, 0, -17344, 32384, 32640, 32512], [16256, -32768, 96, 64, 15488, 0, 32640, 0],
                  [-16192, -16512, 256, -32384, 15360, 32640, -128, 0],
                  [16576, -16064, -32640, 0, -17216, -32768, -128, -32768]]],
    "float16": [[[14336, 0, 0, 0, -24064, 31744, 31744, 31744], [15360, -32768, 0, 0, 9216, 0, 31744, 0],
                 [-14848, -17408, 0, -32768, 8192, 31744, -1024, 0],
                 [17920, -13824, -32768, 0, -23040, -32768, -1024, -32768]]],
    "float32": [[[1056964608, 0, 12582912, 0, -1136656384, 2122317824, 2139095040, 2130706432],
                 [1065353216, -2147483648, 6291456, 4194304, 1015021568, 0, 2139095040, 0],
                 [-1061158912, -1082130432, 16777216, -2122317824, 1006632960, 2139095040, -8388608, 0],
                 [1086324736, -1052770304, -2139095040, 0, -1128267776, -2147483648, -8388608, -2147483648]]],
}
DTYPES = {"bfloat16": jnp.bfloat16, "float16": np.float16, "float32": np.float32}
BITS = {"bfloat16": np.int16, "float16": np.int16, "float32": np.int32}


def convert_moe_packed_tensors(blocks, scales, dtype):
    """_convert_moe_packed_tensors: lut[blk & 0x0F] to the even columns, lut[blk >> 4] to the odd ones,
    ldexp(sub, scales - 127), reshape to [*prefix, G * B * 2], transpose(1, 2); the exact float64
    result rounded once to dtype (float64 -> float32 -> bfloat16 is one rounding: the values fit)."""
    lut = np.array(mxfp4.FP4_VALUES, np.float64)
    *prefix_shape, g, b = blocks.shape
    rows_total = int(np.prod(prefix_shape)) * g
    blocks = blocks.reshape(rows_total, b)
    exp = scales.astype(np.int32).reshape(rows_total, 1) - 127
    out = np.empty((rows_total, b * 2), np.float64)
    out[:, 0::2] = lut[blocks & 0x0F]
    out[:, 1::2] = lut[blocks >> 4]
    out = np.ldexp(out, exp).reshape(*prefix_shape, g * b * 2).swapaxes(1, 2)
    with np.errstate(over="ignore"):
        if dtype == "float16":
            return out.astype(np.float16)
        return out.astype(np.float32).astype(DTYPES[dtype])


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_golden_bits_of_transformers(dtype):
    got = mxfp4.dequantize_experts(BLOCKS, SCALES, dtype=DTYPES[dtype])
    assert got.dtype == np.dtype(DTYPES[dtype]) and got.shape == (1, 4, 8)
    np.testing.assert_array_equal(got.view(BITS[dtype]), GOLDEN_BITS[dtype])
    np.testing.assert_array_equal(convert_moe_packed_tensors(BLOCKS, SCALES, dtype).view(BITS[dtype]),
                                  GOLDEN_BITS[dtype])


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_every_byte_with_every_scale_is_bit_for_bit(dtype):
    rng = np.random.default_rng(0)
    blocks = rng.integers(0, 256, (2, 256, 18, 16), dtype=np.uint8)
    blocks[:, :, :16] = np.arange(256, dtype=np.uint8).reshape(16, 16)  # every byte in every row
    scales = rng.integers(0, 256, (2, 256, 18), dtype=np.uint8)
    scales[:, :, :16] = np.arange(256, dtype=np.uint8)[:, None]  # row r: scale r
    got = mxfp4.dequantize_experts(blocks, scales, dtype=DTYPES[dtype])
    want = convert_moe_packed_tensors(blocks, scales, dtype)
    assert got.shape == (2, 18 * 32, 256) and got.flags.c_contiguous
    np.testing.assert_array_equal(got.view(BITS[dtype]), want.view(BITS[dtype]))
    assert not np.isnan(got.astype(np.float32)).any()


def test_gpt_oss_layout_and_chunking():
    # gate_up_proj_blocks [E, 2I, H/32, 16] -> [E, H, 2I]; down_proj_blocks [E, H, I/32, 16] -> [E, I, H]
    rng = np.random.default_rng(1)
    experts, two_i, hidden = 3, 10, 64
    blocks = rng.integers(0, 256, (experts, two_i, hidden // 32, 16), dtype=np.uint8)
    scales = rng.integers(120, 135, (experts, two_i, hidden // 32), dtype=np.uint8)
    stored = mxfp4.dequantize(blocks, scales)
    assert stored.shape == (experts, two_i, hidden) and stored.dtype == np.float32
    np.testing.assert_array_equal(mxfp4.dequantize(blocks, scales, rows_per_chunk=7), stored)
    np.testing.assert_array_equal(mxfp4.dequantize_experts(blocks, scales), stored.swapaxes(1, 2))
    # the low nibble is the even value of the pair
    first = mxfp4.FP4_VALUES[blocks[0, 0, 0, 0] & 0x0F] * 2.0 ** (int(scales[0, 0, 0]) - 127)
    second = mxfp4.FP4_VALUES[blocks[0, 0, 0, 0] >> 4] * 2.0 ** (int(scales[0, 0, 0]) - 127)
    assert (stored[0, 0, 0], stored[0, 0, 1]) == (first, second)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="must be uint8"):
        mxfp4.dequantize(BLOCKS.astype(np.int32), SCALES)
    with pytest.raises(ValueError, match=r"blocks must have shape \[..., G, B\] and scales \[..., G\]"):
        mxfp4.dequantize(BLOCKS, SCALES[:, :4])
    with pytest.raises(ValueError, match=r"blocks must have shape \[E, rows, G, B\]"):
        mxfp4.dequantize_experts(BLOCKS[0], SCALES[0])
    with pytest.raises(ValueError, match="unknown dtype 'float64'; choose one of: float32, bfloat16, float16"):
        mxfp4.dequantize(BLOCKS, SCALES, dtype=np.float64)
