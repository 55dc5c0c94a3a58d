"""posenc.mrope: multi-axis RoPE against NumPy transcriptions of Hugging Face's Qwen2-VL / Qwen3-VL
code (rotation and get_rope_index) and of rope-vit's 2D RoPE (axial and RoPE-Mixed); equal axes give
plain RoPE bitwise; per-axis shift invariance; errors."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posenc import mrope, rope

RNG = np.random.default_rng(0)


def randn(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


# ---------------------------------------------------------------------------
# Transcriptions (NumPy) of huggingface/transformers, src/transformers/models/qwen2_vl/modeling_qwen2_vl.py
# (commit 00b676f8f0489b88652a31d70751cc540dd06305) and models/qwen3_vl/modeling_qwen3_vl.py
# (commit 00709b862bb8f14a5435bb7195592579168496e4). q is [B, H, L, D] there (unsqueeze_dim=1).
# ---------------------------------------------------------------------------


def hf_rotary_freqs(inv_freq, position_ids):
    """Qwen2VLRotaryEmbedding.forward up to `freqs`: (inv_freq @ position_ids).transpose -> [3, B, L, F]."""
    return position_ids[..., None].astype(np.float32) * np.asarray(inv_freq, np.float32)


def hf_rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return np.concatenate([-x2, x1], axis=-1)


def hf_qwen2vl_apply(q, inv_freq, position_ids, mrope_section, unsqueeze_dim=1):
    """Qwen2VLRotaryEmbedding.forward (cos / sin of cat(freqs, freqs)) + apply_multimodal_rotary_pos_emb."""
    freqs = hf_rotary_freqs(inv_freq, position_ids)
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = np.cos(emb), np.sin(emb)
    mrope_section = mrope_section * 2
    split = np.cumsum(mrope_section)[:-1]
    cos = np.concatenate([m[i % 3] for i, m in enumerate(np.split(cos, split, axis=-1))], axis=-1)
    sin = np.concatenate([m[i % 3] for i, m in enumerate(np.split(sin, split, axis=-1))], axis=-1)
    cos, sin = np.expand_dims(cos, unsqueeze_dim), np.expand_dims(sin, unsqueeze_dim)
    return q * cos + hf_rotate_half(q) * sin


def hf_apply_interleaved_mrope(freqs, mrope_section):
    """Qwen3VLTextRotaryEmbedding.apply_interleaved_mrope."""
    freqs_t = freqs[0].copy()  # just overwrite the first dimension T
    for dim, offset in enumerate((1, 2), start=1):  # H, W
        length = mrope_section[dim] * 3
        idx = slice(offset, length, 3)
        freqs_t[..., idx] = freqs[dim, ..., idx]
    return freqs_t


def hf_qwen3vl_apply(q, inv_freq, position_ids, mrope_section, unsqueeze_dim=1):
    """Qwen3VLTextRotaryEmbedding.forward + apply_rotary_pos_emb (rotate_half)."""
    freqs = hf_apply_interleaved_mrope(hf_rotary_freqs(inv_freq, position_ids), mrope_section)
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = np.expand_dims(np.cos(emb), unsqueeze_dim), np.expand_dims(np.sin(emb), unsqueeze_dim)
    return q * cos + hf_rotate_half(q) * sin


def hf_get_rope_index(input_ids, image_grid_thw, video_grid_thw, *, spatial_merge_size, image_token_id,
                      video_token_id, vision_start_token_id, second_per_grid_ts=None, tokens_per_second=None):
    """Qwen2VLModel.get_rope_index (attention_mask all ones); with second_per_grid_ts, Qwen2.5-VL's video
    temporal ids (modeling_qwen2_5_vl.py get_rope_index: (arange(t) * second_per_grid_t * tokens_per_second).long())."""
    position_ids = np.ones((3, *input_ids.shape), np.int64)
    image_index, video_index = 0, 0
    for i, ids in enumerate(input_ids):
        vision_start_indices = np.argwhere(ids == vision_start_token_id)[:, 0]
        vision_tokens = ids[vision_start_indices + 1]
        image_nums = int((vision_tokens == image_token_id).sum())
        video_nums = int((vision_tokens == video_token_id).sum())
        input_tokens = ids.tolist()
        llm_pos_ids_list: list = []
        st = 0
        remain_images, remain_videos = image_nums, video_nums
        for _ in range(image_nums + video_nums):
            if image_token_id in input_tokens and remain_images > 0:
                ed_image = input_tokens.index(image_token_id, st)
            else:
                ed_image = len(input_tokens) + 1
            if video_token_id in input_tokens and remain_videos > 0:
                ed_video = input_tokens.index(video_token_id, st)
            else:
                ed_video = len(input_tokens) + 1
            seconds = None
            if ed_image < ed_video:
                t, h, w = image_grid_thw[image_index]
                image_index += 1
                remain_images -= 1
                ed = ed_image
            else:
                t, h, w = video_grid_thw[video_index]
                if second_per_grid_ts is not None:
                    seconds = second_per_grid_ts[video_index]
                video_index += 1
                remain_videos -= 1
                ed = ed_video
            llm_grid_t, llm_grid_h, llm_grid_w = t, h // spatial_merge_size, w // spatial_merge_size
            text_len = ed - st
            st_idx = llm_pos_ids_list[-1].max() + 1 if len(llm_pos_ids_list) > 0 else 0
            llm_pos_ids_list.append(np.broadcast_to(np.arange(text_len), (3, text_len)) + st_idx)
            t_index = np.broadcast_to(np.arange(llm_grid_t)[:, None], (llm_grid_t, llm_grid_h * llm_grid_w))
            if seconds is not None:  # a long tensor times Python floats: float32 in torch, then .long()
                t_index = t_index.astype(np.float32) * np.float32(seconds) * np.float32(tokens_per_second)
            t_index = t_index.astype(np.int64).flatten()
            h_index = np.broadcast_to(np.arange(llm_grid_h)[None, :, None], (llm_grid_t, llm_grid_h, llm_grid_w))
            w_index = np.broadcast_to(np.arange(llm_grid_w)[None, None, :], (llm_grid_t, llm_grid_h, llm_grid_w))
            llm_pos_ids_list.append(np.stack([t_index, h_index.flatten(), w_index.flatten()]) + text_len + st_idx)
            st = ed + llm_grid_t * llm_grid_h * llm_grid_w
        if st < len(input_tokens):
            st_idx = llm_pos_ids_list[-1].max() + 1 if len(llm_pos_ids_list) > 0 else 0
            text_len = len(input_tokens) - st
            llm_pos_ids_list.append(np.broadcast_to(np.arange(text_len), (3, text_len)) + st_idx)
        position_ids[:, i] = np.concatenate(llm_pos_ids_list, axis=1).reshape(3, -1)
    return position_ids


# ---------------------------------------------------------------------------
# Transcriptions (NumPy, complex128) of naver-ai/rope-vit models/vit_rope.py (commit ce85c2e56c5f):
# init_t_xy, compute_axial_cis, compute_mixed_cis, init_random_2d_freqs, apply_rotary_emb. x is
# [B, H, N, D] there, rotated as complex pairs (2i, 2i + 1) (torch.view_as_complex).
# ---------------------------------------------------------------------------


def vit_init_t_xy(end_x, end_y):
    t = np.arange(end_x * end_y, dtype=np.float32)
    return t % end_x, np.floor(t / end_x)


def vit_compute_axial_cis(dim, end_x, end_y, theta=100.0):
    freqs_x = 1.0 / (theta ** (np.arange(0, dim, 4)[: (dim // 4)].astype(np.float32) / dim))
    freqs_y = 1.0 / (theta ** (np.arange(0, dim, 4)[: (dim // 4)].astype(np.float32) / dim))
    t_x, t_y = vit_init_t_xy(end_x, end_y)
    return np.concatenate([np.exp(1j * np.outer(t_x, freqs_x)), np.exp(1j * np.outer(t_y, freqs_y))], axis=-1)


def vit_compute_mixed_cis(freqs, t_x, t_y, num_heads):
    """freqs [2, depth, H * F] -> [depth, H, N, F]."""
    n, depth = t_x.shape[0], freqs.shape[1]
    fx = (t_x[:, None] @ freqs[0][:, None, :]).reshape(depth, n, num_heads, -1).transpose(0, 2, 1, 3)
    fy = (t_y[:, None] @ freqs[1][:, None, :]).reshape(depth, n, num_heads, -1).transpose(0, 2, 1, 3)
    return np.exp(1j * (fx + fy))


def vit_init_random_2d_freqs(dim, num_heads, angles, theta=10.0):
    """init_random_2d_freqs with the per-head draws `angles` [H] given (torch.rand(1) * 2 pi there)."""
    mag = 1 / (theta ** (np.arange(0, dim, 4)[: (dim // 4)].astype(np.float64) / dim))
    freqs_x, freqs_y = [], []
    for i in range(num_heads):
        a = angles[i]
        freqs_x.append(np.concatenate([mag * np.cos(a), mag * np.cos(np.pi / 2 + a)]))
        freqs_y.append(np.concatenate([mag * np.sin(a), mag * np.sin(np.pi / 2 + a)]))
    return np.stack([np.stack(freqs_x), np.stack(freqs_y)])


def vit_apply_rotary_emb(x, freqs_cis):
    xc = x.astype(np.float64).reshape(*x.shape[:-1], -1, 2)
    out = (xc[..., 0] + 1j * xc[..., 1]) * freqs_cis
    return np.stack([out.real, out.imag], axis=-1).reshape(x.shape)


# ---------------------------------------------------------------------------
# Frequency-to-axis maps.
# ---------------------------------------------------------------------------


def test_frequency_axes_of_qwen2_vl_and_qwen3_vl():
    np.testing.assert_array_equal(mrope.frequency_axes([16, 24, 24]), [0] * 16 + [1] * 24 + [2] * 24)
    axes = mrope.frequency_axes([24, 20, 20], interleaved=True)
    np.testing.assert_array_equal(axes, [0, 1, 2] * 20 + [0] * 4)  # T H W T H W ... T T T T
    # HF's rewrite of freqs[0] with the axis index itself as the "frequency" gives the same map
    np.testing.assert_array_equal(hf_apply_interleaved_mrope(np.arange(3)[:, None] * np.ones((3, 64)),
                                                             [24, 20, 20]), axes)
    for sections in ([24, 20, 20], [11, 11, 10], [5, 2, 1], [3, 3, 3]):
        counts = np.bincount(mrope.frequency_axes(sections, interleaved=True), minlength=3)
        np.testing.assert_array_equal(counts, sections)


# ---------------------------------------------------------------------------
# apply against Hugging Face Qwen2-VL (contiguous) and Qwen3-VL (interleaved).
# ---------------------------------------------------------------------------

CASES = [  # (head_dim, sections, base, interleaved)
    (128, [16, 24, 24], 1e6, False),  # Qwen2-VL-7B: head_dim 128, rope_theta 1e6
    (128, [24, 20, 20], 5e6, True),  # Qwen3-VL: head_dim 128, mrope_section [24, 20, 20]
    (16, [2, 3, 3], 1e4, False),
    (16, [4, 2, 2], 1e4, True),
]


def _vision_positions(batch):
    """[3, batch, L] ids of text + an image grid + text, one sequence per batch row (different layouts)."""
    rows = [mrope.position_ids([3, (1, 2, 3), 2, (2, 2, 2), 1]),
            mrope.position_ids([1, (2, 3, 2), 7])]
    length = min(r.shape[1] for r in rows)
    return np.stack([rows[b % 2][:, :length] for b in range(batch)], axis=1)


@pytest.mark.parametrize("head_dim,sections,base,interleaved", CASES)
def test_apply_matches_hugging_face(head_dim, sections, base, interleaved):
    inv_freq, _ = rope.frequencies("default", head_dim, base=base)
    pos = _vision_positions(2)  # [3, B, L]
    q = randn(2, pos.shape[-1], 3, head_dim)  # [B, L, H, D]
    hf = hf_qwen3vl_apply if interleaved else hf_qwen2vl_apply
    want = hf(q.transpose(0, 2, 1, 3), inv_freq, pos, sections).transpose(0, 2, 1, 3)
    for angles in rope.ANGLES:
        got = mrope.apply(q, pos, inv_freq, sections=sections, interleaved=interleaved, angles=angles)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=angles)
    # the ids of the other axes matter, and so does the split: the test tells these apart
    assert not np.allclose(rope.apply(q, pos[0], inv_freq), want, atol=1e-3)
    if interleaved:
        assert not np.allclose(mrope.apply(q, pos, inv_freq, sections=sections), want, atol=1e-3)


def test_apply_interleaved_layout_is_a_permutation_of_half():
    inv_freq, _ = rope.frequencies("default", 16)
    pos = _vision_positions(1)
    x = randn(1, pos.shape[-1], 2, 16)
    perm = np.concatenate([np.arange(0, 16, 2), np.arange(1, 16, 2)])  # x_half = x_interleaved[..., perm]
    for interleaved in (False, True):
        kw = dict(sections=[4, 2, 2], interleaved=interleaved)
        half = mrope.apply(x[..., perm], pos, inv_freq, layout="half", **kw)
        inter = mrope.apply(x, pos, inv_freq, layout="interleaved", **kw)
        np.testing.assert_allclose(half, np.asarray(inter)[..., perm], rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------
# Properties: equal axes are plain RoPE; each axis is relative; partial rotary; dtypes; transforms.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("interleaved", [False, True])
def test_equal_axes_reduce_to_rope_bitwise(interleaved):
    x = randn(2, 7, 3, 20)  # Dh 20, rotary dim 16: four dims pass through
    inv_freq, _ = rope.frequencies("default", 16)
    pos = RNG.integers(0, 10**6, (2, 7))
    for layout in rope.LAYOUTS:
        for angles in rope.ANGLES:
            kw = dict(layout=layout, attention_factor=1.3, angles=angles)
            got = mrope.apply(x, np.broadcast_to(pos, (3, 2, 7)), inv_freq, sections=[4, 2, 2],
                              interleaved=interleaved, **kw)
            np.testing.assert_array_equal(got, rope.apply(x, pos, inv_freq, **kw), err_msg=f"{layout} {angles}")


def _logits(q, k, q_pos, k_pos, inv_freq, **kw):
    return np.einsum("lhd,mhd->hlm", mrope.apply(q, q_pos, inv_freq, **kw), mrope.apply(k, k_pos, inv_freq, **kw))


@pytest.mark.parametrize("interleaved", [False, True])
def test_logits_depend_only_on_per_axis_differences(interleaved):
    q, k = randn(6, 2, 16), randn(5, 2, 16)
    inv_freq, _ = rope.frequencies("default", 16)
    q_pos, k_pos = RNG.integers(0, 50, (3, 6)), RNG.integers(0, 50, (3, 5))
    kw = dict(sections=[4, 2, 2], interleaved=interleaved)
    base = _logits(q, k, q_pos, k_pos, inv_freq, **kw)
    for shift in ([1000, 1000, 1000], [10**6, 7, 123456]):  # shared by every axis, then one per axis
        s = np.asarray(shift)[:, None]
        np.testing.assert_allclose(_logits(q, k, q_pos + s, k_pos + s, inv_freq, **kw), base, rtol=1e-5, atol=2e-5)
    s = np.asarray([0, 0, 3])[:, None]  # moving the keys along one axis only changes the logits
    assert not np.allclose(_logits(q, k, q_pos, k_pos + s, inv_freq, **kw), base, atol=1e-3)


def test_partial_rotary_passes_the_rest_through_and_keeps_dtype():
    x = jnp.asarray(randn(5, 2, 12), jnp.bfloat16)
    inv_freq, _ = rope.frequencies("default", 8)
    pos = RNG.integers(0, 9, (3, 5))
    out = mrope.apply(x, pos, inv_freq, sections=[2, 1, 1])
    assert out.dtype == jnp.bfloat16 and out.shape == x.shape
    np.testing.assert_array_equal(out[..., 8:], x[..., 8:])
    np.testing.assert_array_equal(out[..., :8], mrope.apply(x[..., :8], pos, inv_freq, sections=[2, 1, 1]))


def test_jit_vmap_and_grad():
    x = randn(2, 4, 2, 8)
    inv_freq, _ = rope.frequencies("default", 8)
    pos = RNG.integers(0, 9, (3, 2, 4))
    f = functools.partial(mrope.apply, sections=[2, 1, 1], interleaved=True)
    want = f(x, pos, inv_freq)
    np.testing.assert_allclose(jax.jit(f)(x, pos, inv_freq), want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(jax.vmap(f, in_axes=(0, 1, None))(x, pos, inv_freq), want, rtol=1e-6, atol=1e-6)
    g = jax.grad(lambda x: jnp.sum(f(x, pos, inv_freq) ** 2))(x)  # a rotation keeps the norm: d|Rx|^2/dx = 2x
    np.testing.assert_allclose(g, 2 * x, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------
# position_ids against get_rope_index.
# ---------------------------------------------------------------------------

IMAGE, VIDEO, START, END, TEXT = 151655, 151656, 151652, 151653, 9


def _tokens(layout, merge):
    """input_ids and grid_thw (before the spatial merge) of a layout [int | ("image" | "video", t, h, w)]."""
    ids, images, videos = [], [], []
    for seg in layout:
        if isinstance(seg, int):
            ids += [TEXT] * seg
        else:
            kind, t, h, w = seg
            ids += [START] + [IMAGE if kind == "image" else VIDEO] * (t * h * w // merge**2) + [END]
            (images if kind == "image" else videos).append((t, h, w))
    return np.asarray([ids]), np.asarray(images or np.zeros((0, 3)), int), np.asarray(videos or np.zeros((0, 3)), int)


def _segments(layout, merge, steps=None):
    """posenc.mrope segments of the same layout: vision start / end tokens are text."""
    segs, v = [], 0
    for seg in layout:
        if isinstance(seg, int):
            segs.append(seg)
        else:
            kind, t, h, w = seg
            grid = (t, h // merge, w // merge)
            if kind == "video" and steps is not None:
                grid, v = (*grid, steps[v]), v + 1
            segs += [1, grid, 1]
    return segs


LAYOUTS = [
    [5, ("image", 1, 4, 6), 3],
    [2, ("video", 3, 4, 4), 4, ("image", 1, 8, 4), ("image", 1, 2, 2), 6],
    [("image", 1, 2, 4), 1],
    [7],
]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_position_ids_match_get_rope_index(layout):
    ids, images, videos = _tokens(layout, merge=2)
    if not len(images) and not len(videos):  # get_rope_index's text-only branch: arange on all axes
        want = np.broadcast_to(np.arange(ids.shape[1]), (3, 1, ids.shape[1]))
    else:
        want = hf_get_rope_index(ids, images, videos, spatial_merge_size=2, image_token_id=IMAGE,
                                 video_token_id=VIDEO, vision_start_token_id=START)
    got = mrope.position_ids(_segments(layout, 2))
    assert got.dtype == np.int32 and got.shape == (3, ids.shape[1])
    np.testing.assert_array_equal(got, want[:, 0])


def test_position_ids_temporal_steps_match_qwen2_5_vl():
    layout = [3, ("video", 4, 4, 4), 2, ("video", 3, 2, 2), 1]
    ids, images, videos = _tokens(layout, merge=2)
    seconds, tokens_per_second = [0.75, 2.0], 2
    want = hf_get_rope_index(ids, images, videos, spatial_merge_size=2, image_token_id=IMAGE,
                             video_token_id=VIDEO, vision_start_token_id=START,
                             second_per_grid_ts=seconds, tokens_per_second=tokens_per_second)
    got = mrope.position_ids(_segments(layout, 2, steps=[s * tokens_per_second for s in seconds]))
    np.testing.assert_array_equal(got, want[:, 0])
    np.testing.assert_array_equal(got[0, 4:20:4], [4, 5, 7, 8])  # 2 x 2 frames at 4 + floor(1.5 i)


def test_position_ids_golden_and_start():
    # the example of get_rope_index's docstring: a 3 x 2 x 2 video, then 5 text tokens
    want = [[0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 4, 5, 6, 7],
            [0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 3, 4, 5, 6, 7],
            [0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 3, 4, 5, 6, 7]]
    np.testing.assert_array_equal(mrope.position_ids([(3, 2, 2), 5]), want)
    full = mrope.position_ids([(3, 2, 2), 5, (1, 2, 3), 2])
    head = mrope.position_ids([(3, 2, 2), 5])
    np.testing.assert_array_equal(mrope.position_ids([(1, 2, 3), 2], start=int(head.max()) + 1), full[:, 17:])
    assert mrope.position_ids([]).shape == (3, 0)


# ---------------------------------------------------------------------------
# 2D RoPE against rope-vit.
# ---------------------------------------------------------------------------


def test_grid_positions_match_init_t_xy():
    t_x, t_y = vit_init_t_xy(end_x=5, end_y=3)
    np.testing.assert_array_equal(mrope.grid_positions(3, 5), np.stack([t_x, t_y]))


def test_axial_matches_rope_vit():
    dim, end_x, end_y = 32, 5, 3
    np.testing.assert_allclose(mrope.axial_frequencies(dim)[: dim // 4],
                               1.0 / 100.0 ** (np.arange(0, dim, 4) / dim), rtol=1e-6)
    x = randn(2, end_x * end_y, 3, dim)  # [B, N, H, D]
    want = vit_apply_rotary_emb(x.transpose(0, 2, 1, 3), vit_compute_axial_cis(dim, end_x, end_y))
    for angles in rope.ANGLES:
        got = mrope.apply(x, mrope.grid_positions(end_y, end_x), mrope.axial_frequencies(dim),
                          sections=(dim // 4, dim // 4), layout="interleaved", angles=angles)
        np.testing.assert_allclose(got, want.transpose(0, 2, 1, 3), rtol=1e-5, atol=1e-5)


def test_mixed_matches_rope_vit():
    dim, heads, end_x, end_y = 16, 3, 4, 3
    freqs = randn(2, heads, dim // 2)
    x = randn(2, end_x * end_y, heads, dim)
    t_x, t_y = vit_init_t_xy(end_x, end_y)
    cis = vit_compute_mixed_cis(freqs.reshape(2, 1, -1).astype(np.float64), t_x, t_y, heads)[0]  # depth 1
    want = vit_apply_rotary_emb(x.transpose(0, 2, 1, 3), cis).transpose(0, 2, 1, 3)
    for angles in rope.ANGLES:
        got = mrope.apply_mixed(x, mrope.grid_positions(end_y, end_x), freqs, layout="interleaved", angles=angles)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_mixed_frequencies_follow_init_random_2d_freqs():
    dim, heads = 32, 6
    freqs = np.asarray(mrope.mixed_frequencies(jax.random.key(3), dim, heads))
    assert freqs.shape == (2, heads, dim // 2) and freqs.dtype == np.float32
    angles = np.arctan2(freqs[1, :, 0], freqs[0, :, 0]) % (2 * np.pi)  # the per-head draws
    assert len(set(np.round(angles, 4))) == heads  # one draw per head
    np.testing.assert_allclose(freqs, vit_init_random_2d_freqs(dim, heads, angles), rtol=1e-5, atol=1e-6)
    again = mrope.mixed_frequencies(jax.random.key(3), dim, heads)
    np.testing.assert_array_equal(again, freqs)  # the key decides the draws
    fixed = mrope.mixed_frequencies(None, dim, heads, rotate=False)
    np.testing.assert_allclose(fixed, vit_init_random_2d_freqs(dim, heads, np.zeros(heads)), atol=1e-7)


def test_unrotated_mixed_is_axial_and_mixed_is_relative():
    dim, heads = 16, 2
    x = randn(12, heads, dim)
    pos = mrope.grid_positions(3, 4)
    mixed = mrope.apply_mixed(x, pos, mrope.mixed_frequencies(None, dim, heads, base=10.0, rotate=False))
    axial = mrope.apply(x, pos, mrope.axial_frequencies(dim, base=10.0), sections=(dim // 4, dim // 4))
    np.testing.assert_allclose(mixed, axial, rtol=1e-6, atol=1e-6)
    freqs = mrope.mixed_frequencies(jax.random.key(0), dim, heads)
    k = randn(12, heads, dim)

    def logits(shift):
        p = pos + np.asarray(shift)[:, None]
        return np.einsum("lhd,mhd->hlm", mrope.apply_mixed(x, p, freqs), mrope.apply_mixed(k, p, freqs))

    np.testing.assert_allclose(logits([500, 70000]), logits([0, 0]), rtol=1e-5, atol=2e-5)


def test_mixed_gradient_reaches_the_frequencies():
    x = randn(6, 2, 8)
    pos = mrope.grid_positions(2, 3)
    freqs = mrope.mixed_frequencies(jax.random.key(1), 8, 2)

    def loss(f, angles):
        return jnp.sum(mrope.apply_mixed(x, pos, f, angles=angles)[..., 0])

    exact, canonical = jax.grad(loss)(freqs, "exact"), jax.grad(loss)(freqs, "canonical")
    assert np.all(np.isfinite(exact)) and np.abs(exact).max() > 0
    np.testing.assert_allclose(exact, canonical, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------
# Errors: one ValueError naming the bad value.
# ---------------------------------------------------------------------------


def test_bad_input_raises_one_clear_value_error():
    x = randn(4, 2, 16)
    inv_freq, _ = rope.frequencies("default", 16)
    pos = RNG.integers(0, 9, (3, 4))
    cases = [
        (lambda: mrope.apply(x, pos, inv_freq, sections=[2, 3, 2]), r"must sum to len\(inv_freq\) = 8; they sum to 7"),
        (lambda: mrope.apply(x, pos, inv_freq, sections=[4, 4]), r"one entry per axis.*A = 3"),
        (lambda: mrope.apply(x, pos, inv_freq, sections=[0, 4, 4], interleaved=True), "beyond the 8 frequencies"),
        (lambda: mrope.apply(x, pos, inv_freq, sections=[4, -1, 5]), r"sections\[1\] must be an integer >= 0"),
        (lambda: mrope.apply(x, pos, inv_freq, sections=8), "sections must be a non-empty sequence"),
        (lambda: mrope.apply(x, pos[0], inv_freq, sections=[8]), r"positions must be \[A, ..., L\]"),
        (lambda: mrope.apply(x, pos.astype(np.float32), inv_freq, sections=[4, 2, 2]), "integer array"),
        (lambda: mrope.apply(x, pos, inv_freq, sections=[4, 2, 2], layout="neox"), "unknown layout 'neox'"),
        (lambda: mrope.position_ids([3, (1, 0, 2)]), r"segments\[1\]\[1\] must be an integer >= 1"),
        (lambda: mrope.position_ids([3, (1, 2)]), r"segments\[1\] must be an int \(a text run\)"),
        (lambda: mrope.axial_frequencies(6), r"rotary_dim must be a multiple of 4 \(.*\); got 6"),
        (lambda: mrope.apply_mixed(x, pos[:2], np.zeros((2, 3, 8))), r"freqs must be \[2, H, F\]"),
        (lambda: mrope.apply_mixed(x, pos, np.zeros((2, 2, 8))), r"positions must be \[2, ..., L\]"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
