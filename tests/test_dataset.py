"""A fixed training set (train.dataset_size) against the official data loading of Cho et al. 2024.

The official ``run.py`` (HanseulJo/position-coupling) draws ``n_data``
examples once and iterates ``DataLoader(dataset, batch_size, shuffle=True)``
(``src/data/arithmetic_dataset.py`` ``build_loader``; ``drop_last`` False)
over epochs: torch's ``RandomSampler`` yields a fresh ``torch.randperm(n)``
each epoch and ``BatchSampler`` cuts it into batches, the last one partial.
Its structure is transcribed below (numpy's permutation for torch's); the
steps of :mod:`posenc.training.dataset` must have it, visit fixed examples, and
draw the coupled start ids anew at each visit as the official ``__getitem__``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import posenc.tasks as tasks
from posenc.configs import default
from posenc.training import dataset, prepare, step


def official_epoch(n, batch_size, rng):
    """One epoch of ``DataLoader(shuffle=True, drop_last=False)``: a fresh permutation, cut into batches."""
    order = rng.permutation(n)  # RandomSampler.__iter__: torch.randperm(n, generator=generator)
    return [order[i:i + batch_size] for i in range(0, n, batch_size)]  # BatchSampler, drop_last=False


def _ours(root, n, batch_size, epochs):
    """Per epoch, the example indices of each step's valid rows."""
    per_epoch = dataset.steps_per_epoch(n, batch_size)
    out = []
    for e in range(epochs):
        batches = []
        for t in range(e * per_epoch, (e + 1) * per_epoch):
            index, valid = dataset.indices(root, jnp.int32(t), batch_size, n)
            batches.append(np.asarray(index)[np.asarray(valid)])
        out.append(batches)
    return out


@pytest.mark.parametrize("n,batch_size", [(10, 4), (12, 4), (1, 3), (37, 8)])
def test_epochs_have_the_official_loader_structure(n, batch_size):
    root = jax.random.key(3)
    ours = _ours(root, n, batch_size, 3)
    official = official_epoch(n, batch_size, np.random.default_rng(0))
    for epoch, batches in enumerate(ours):
        assert [len(b) for b in batches] == [len(b) for b in official]  # B, ..., B, n mod B
        assert sorted(np.concatenate(batches).tolist()) == list(range(n))  # every example once an epoch
        np.testing.assert_array_equal(np.concatenate(batches), dataset.epoch_order(root, epoch, n))
    if n >= 10:  # a fresh order every epoch, and another for another data root
        orders = [np.concatenate(b).tolist() for b in ours]
        assert orders[0] != orders[1] != orders[2]
        assert np.concatenate(_ours(jax.random.key(4), n, batch_size, 1)[0]).tolist() != orders[0]


def test_permute_is_a_bijection_of_every_size():
    for n in (1, 2, 3, 5, 16, 17, 1000, 4097):
        image = np.asarray(dataset.permute(jnp.arange(n), jax.random.key(n), n))
        assert sorted(image.tolist()) == list(range(n))


def test_examples_are_fixed_and_their_coupled_start_is_drawn_at_each_visit():
    task = tasks.make("addition", format="reversed", zero_pad=True, coupled=True, max_position=40,
                      operand_lengths="independent")
    root, n, B, length = jax.random.key(0), 6, 4, task.seq_len(8) - 1
    visits = {}  # example index -> (tokens, position ids) of each visit
    for t in range(2 * dataset.steps_per_epoch(n, B)):
        batch = dataset.batch(task, (root, jnp.int32(t), n), jax.random.fold_in(root, t), B, length)
        index, valid = dataset.indices(root, jnp.int32(t), B, n)
        for row in np.flatnonzero(np.asarray(valid)):
            visits.setdefault(int(index[row]), []).append((np.asarray(batch["inputs"][row]),
                                                           np.asarray(batch["position_ids"][row])))
        assert not np.asarray(batch["mask"])[~np.asarray(valid)].any()  # the last batch's rest adds no loss
    assert sorted(visits) == list(range(n)) and all(len(v) == 2 for v in visits.values())
    for (tok1, _), (tok2, _) in visits.values():
        np.testing.assert_array_equal(tok1, tok2)  # the same example at each visit
    starts = [(ids1[2], ids2[2]) for (_, ids1), (_, ids2) in visits.values()]  # the first digit's id: s0 + 1
    assert any(a != b for a, b in starts)  # the start id drawn anew (official: torch.randint in __getitem__)


def test_examples_seen_counts_the_visits():
    assert dataset.examples_seen(30, 16, 100) == 4 * 100 + 2 * 16  # 7 steps an epoch, the 7th holds 4
    assert dataset.examples_seen(7, 16, 100) == 100
    assert dataset.examples_seen(3, 64, 10 ** 5) == 192


def _config(**train):
    c = default.get_config()
    c.task.name = "addition"
    c.task.train_length = 16
    c.eval.lengths = (16,)
    c.model.update(d_model=16, num_layers=1, num_heads=2)
    c.train.update(steps=4, batch_size=4, warmup_steps=1, **train)
    return c


def test_a_step_trains_on_its_epoch_batch_and_the_loss_is_the_mean_over_its_examples():
    from flax import nnx

    from posenc.training import loop

    resolved = prepare.resolve(_config(dataset_size=6))
    assert resolved.train.dataset_size == 6
    _, _, graphdef, state = loop.init_state(resolved)
    root = loop.data_root(resolved.config)
    t = 1  # the second step of the first epoch: rows 4, 5 of the order, then two masked rows
    _, metrics = step.train_chunk_fn(resolved.train, 1)(graphdef, state, root, np.int32(t), np.int32(1))
    batch, _ = step._train_batch(resolved.train, jax.random.fold_in(root, t), None, (root, jnp.int32(t)))
    model, _ = nnx.merge(graphdef, loop.init_state(resolved)[3])
    logits = model(batch["inputs"])
    ce = -jnp.take_along_axis(jax.nn.log_softmax(logits), batch["targets"][..., None], -1)[..., 0]
    rows = (ce * batch["mask"]).sum(-1) / jnp.maximum(batch["mask"].sum(-1), 1)
    assert np.asarray(batch["mask"].sum(-1) > 0).tolist() == [True, True, False, False]
    # the official loss: the mean over the tokens of the last batch's two examples
    expected = (ce * batch["mask"]).sum() / batch["mask"].sum()
    assert float(metrics["loss"][0]) == pytest.approx(float(expected), rel=1e-5)
    assert float(rows[2]) == 0.0


def test_bad_dataset_size_is_refused_before_compiling():
    c = _config(dataset_size=-1)
    with pytest.raises(prepare.ConfigError, match="train.dataset_size"):
        prepare.resolve(c)
    c = default.get_config("text")
    c.train.dataset_size = 100
    with pytest.raises(prepare.ConfigError, match="train.dataset_size=100 draws a fixed set.*'text'"):
        prepare.resolve(c)
    from posenc.training import loop

    resolved = prepare.resolve(_config(dataset_size=6))
    _, _, graphdef, state = loop.init_state(resolved)
    with pytest.raises(ValueError, match="needs its data root and step number"):
        step.train_step_fn(resolved.train)(graphdef, state, jax.random.key(0))
