"""PoSE positions (Zhu et al. 2024): the official sampler, transcribed; coverage; the training option."""

import importlib
import random

import jax
import numpy as np
import pytest

from posenc import pose
from posenc.training import prepare, specs
from posenc.training import step as step_lib


def official_pose_positions(length, target_length, rng):
    """dwzhu-pku/PoSE src/train_pose.py (commit 43b43b3), train_preprocess_function_pose: the position
    ids of one example whose tokenized text is long enough (len_chunk = model_max_position_embeddings =
    ``length``), torch.arange as numpy; returns (rt1, rt, pos_ids)."""
    len_chunk = length
    lt1 = 0
    rt1 = rng.randint(1, (len_chunk + 1) // 2)
    pos_ids = np.arange(len_chunk)  # len(chunked_ids) == len_chunk
    len_pos_ids = len(pos_ids)
    lt = 0
    rt = rng.randint(lt, target_length - len_pos_ids)
    pos_ids[:rt1 - lt1] += lt
    pos_ids[rt1 - lt1:] += rt
    return rt1, rt, pos_ids


@pytest.mark.parametrize("length,target", [(8, 32), (7, 7), (16, 100)])
def test_positions_equal_the_official_sampler_for_its_draws(length, target):
    rng = random.Random(0)
    draws = [official_pose_positions(length, target, rng) for _ in range(20)]
    firsts = np.array([d[0] for d in draws])
    skips = np.array([d[1] for d in draws])
    got = np.asarray(pose.skip_positions(length, firsts, skips))
    np.testing.assert_array_equal(got, np.stack([d[2] for d in draws]))


def test_draws_cover_the_official_ranges_and_stay_below_the_target():
    length, target = 8, 20
    p = np.asarray(pose.positions(jax.random.key(0), length, target_length=target, batch_shape=(4000,)))
    assert p.dtype == np.int32 and p.shape == (4000, length)
    assert (p[:, 0] == 0).all() and (np.diff(p, axis=1) >= 1).all() and p.max() <= target - 1
    first = (np.diff(p, axis=1) > 1).argmax(1) + 1  # where the skip lands (skip 0: no jump)
    jumped = (np.diff(p, axis=1) > 1).any(1)
    skip = p[:, -1] - (length - 1)
    assert set(skip) == set(range(target - length + 1))  # 0 .. target - length, inclusive
    assert set(first[jumped]) == set(range(1, (length + 1) // 2 + 1))  # 1 .. (length + 1) // 2
    assert abs(skip.mean() - (target - length) / 2) < 0.3  # uniform
    # one draw per example, and the same key gives the same positions
    np.testing.assert_array_equal(p, np.asarray(pose.positions(jax.random.key(0), length, target_length=target,
                                                               batch_shape=(4000,))))


def test_every_distance_up_to_the_target_is_trained():
    length, target = 8, 40
    c = pose.coverage(length, target)
    assert (c > 0).all() and c.sum() == pytest.approx(length * (length + 1) / 2)
    plain = pose.coverage(length, length)
    assert plain.shape == (length,) and plain[0] == length  # no skip: distance d occurs length - d times
    np.testing.assert_allclose(plain, length - np.arange(length))


def test_bad_input_fails_in_one_line():
    with pytest.raises(ValueError, match="target_length=4 must be >= the training length 8"):
        pose.positions(jax.random.key(0), 8, target_length=4)


def _config(**train):
    c = importlib.import_module("posenc.configs.default").get_config("tiny")
    c.task.train_length = 16
    c.train.update(batch_size=4, **train)
    return c


def test_training_batches_take_pose_positions_and_evaluation_plain_ones():
    r = prepare.resolve(_config(pose_length=64))
    assert r.train.positions == specs.Positions(pose_length=64)
    batch, positions = step_lib._train_batch(r.train, jax.random.key(3), None)
    p = np.asarray(positions)
    assert p.shape == (4, 16) and p.max() < 64 and (p[:, 0] == 0).all() and len({tuple(x) for x in p}) > 1
    assert specs.Positions.from_config(r.config) == specs.Positions()  # evaluation: 0 .. N - 1
    graphdef, state = __import__("posenc.training.loop", fromlist=["init_state"]).init_state(r)[2:]
    _, metrics = step_lib.train_step_fn(r.train)(graphdef, state, jax.random.key(3))
    assert np.isfinite(float(metrics["loss"]))


def test_bad_pose_settings_fail_before_compiling():
    with pytest.raises(ValueError, match=r"train.pose_length=8 must be 0 \(off\) or >= task.train_length=16"):
        prepare.resolve(_config(pose_length=8))
    c = _config(pose_length=64)
    c.model.position.update(randomized=True, randomized_max_position=64)
    with pytest.raises(ValueError, match="use one or the other"):
        prepare.resolve(c)
    c = _config(pose_length=64)
    c.model.position.update(kind="learned")
    c.model.position.learned.max_length = 32
    with pytest.raises(ValueError, match="can represent 32 positions, fewer than train.pose_length=64"):
        prepare.resolve(c)
