"""compare:hybrid_quick: position from recurrence against position in attention, every point validated."""

from __future__ import annotations

import pytest

from helpers import grid_points
from posenc.configs import compare
from posenc.configs.compare_grids import hybrid


def test_hybrid_quick_has_every_arm_on_every_task_with_three_seeds():
    c = compare.get_config("hybrid_quick")
    points = grid_points(c)  # every point validated (ConfigError on a bad one)
    arms = (*hybrid.HYBRID_ARMS, "swan")
    assert len(points) == len(arms) * 4 * 3
    assert set(c.grid.tasks) == {"copy", "mqar", "passkey", "text"} and c.grid.seeds == (0, 1, 2)
    by_name = {p.name: p.run.spec for p in points if p.name.endswith("_s0")}
    kinds = {arm: by_name[f"copy_{arm}_rms-pre_s0"] for arm in arms}
    assert kinds["gdn_nope"].recurrent is not None and kinds["rope"].recurrent is None
    assert hybrid.three_to_one("mamba2") == ("mamba2", "mamba2", "mamba2", "attention")
    assert kinds["gdn_rope_partial"].position.options["rope"]["rotary_fraction"] == 0.25
    text = [p for p in points if p.name.startswith("text_rope")][0]
    assert text.run.config.eval.lengths == (32, 64, 128, 256, 512)


@pytest.fixture(scope="module")
def quick_runs():
    """hybrid_quick's runs by point name (expanded once for the tests that compare another grid's runs)."""
    return {p.name: p.run for p in grid_points(compare.get_config("hybrid_quick"))}


def test_hybrid_state_ladder_shrinks_the_state_and_keeps_the_rest(quick_runs):
    c = compare.get_config("hybrid_state")
    points = {p.name: p.run for p in grid_points(c)}
    assert len(points) == (3 + len(hybrid.STATE_LADDER)) * 3 and c.grid.tasks == ("copy",)
    for arm in ("rope", "gdn_only", "mamba2_only"):  # the same runs as hybrid_quick's copy cells
        assert points[f"copy_{arm}_rms-pre_s1"].hash == quick_runs[f"copy_{arm}_rms-pre_s1"].hash
    for name, numbers in (("gdn_only_state64", 64), ("gdn_only_state4", 4), ("mamba2_only_state128", 128),
                          ("mamba2_only_state4", 4), ("gdn_nope_state4", 4), ("mamba2_only_n1_state128", 128),
                          ("gdn_only_dk2_state128", 128)):
        run = points[f"copy_{name}_rms-pre_s0"]
        rec = run.config.model.recurrent
        if "mamba2" in name:
            m = rec.mamba2
            assert m.num_heads * m.head_dim * m.state_size == numbers
        else:
            g = rec.gated_deltanet
            assert g.num_value_heads * g.key_head_dim * g.value_head_dim == numbers
        if name == "mamba2_only_n1_state128":
            assert rec.mamba2.num_heads * rec.mamba2.head_dim == 128  # the default width, the state shrunk
        base = run.config.model
        assert (base.d_model, base.num_layers, run.config.train.steps) == (64, 4, 4000)
    assert points["copy_gdn_nope_state4_rms-pre_s0"].config.model.layer_types[-1] == "attention"


def test_hybrid_mqar_probe_sizes_each_variant_by_its_own_vocabulary():
    c = compare.get_config("hybrid_mqar_probe")
    runs = {p.name: p.run for p in grid_points(c)}
    assert len(runs) == 4
    k64 = runs["mqar_k64_p4_rope_rms-pre_s0"]
    assert k64.task.keys == 64 and k64.config.task.train_length == 41 and k64.config.eval.lengths == (41, 81)
    blank = runs["mqar_k16_p8_blank_rope_rms-pre_s0"].task
    assert blank.keys == 16 and blank.random_non_queries is False
    assert runs["mqar_k512_p8_rope_rms-pre_s0"].task.vocab_size > 1024
    assert all(r.config.train.steps == 2000 for r in runs.values())


def test_hybrid_text_long_evaluates_hybrid_quicks_text_runs_further(quick_runs):
    long = {p.name: p.run for p in grid_points(compare.get_config("hybrid_text_long"))}
    assert len(long) == 6 * 3
    for name, run in long.items():
        assert run.hash == quick_runs[name].hash  # the same training: copied runs evaluate without training
    assert long["text_mamba2_only_rms-pre_s0"].config.eval.lengths[-1] == 128 * hybrid.TEXT_LENGTH


def test_hybrid_passkey_chunks_only_the_recurrent_arms(quick_runs):
    runs = {p.name: p.run for p in grid_points(compare.get_config("hybrid_passkey"))}
    assert len(runs) == (len(hybrid.HYBRID_ARMS) + 1) * 3
    assert runs["passkey_rope_rms-pre_s0"].hash == quick_runs["passkey_rope_rms-pre_s0"].hash  # attention unchanged
    assert runs["passkey_mamba2_nope_rms-pre_s0"].config.model.recurrent.mamba2.chunk_size == 32
    assert runs["passkey_gdn_only_rms-pre_s0"].config.model.recurrent.gated_deltanet.chunk_size == 32
    assert runs["passkey_gdn_only_rms-pre_s0"].hash != quick_runs["passkey_gdn_only_rms-pre_s0"].hash


def test_hybrid_mqar_is_zoologys_figure2_budget_per_learning_rate():
    c = compare.get_config("hybrid_mqar")
    runs = {p.name: p.run for p in grid_points(c)}
    assert len(runs) == len(hybrid.ZOOLOGY_DEFAULT_RATES) * (len(hybrid.HYBRID_ARMS) + 1) * 3
    run = runs["mqar_lr2.2e-3_gdn_nope_rms-pre_s0"]
    task = run.task
    assert (task.keys, task.values, task.slots, task.random_non_queries) == (4096, 4096, 7, False)
    assert task.vocab_size > 8192  # Zoology's 8,192 keys and values, and the special tokens
    assert run.config.task.train_length == 129 and run.config.eval.lengths == (129, 257, 513)  # 8, 16, 32 pairs
    train = run.config.train
    assert (train.batch_size, train.dataset_size, train.steps) == (512, 100_000, 64 * 196)  # 64 epochs
    assert train.learning_rate == 2.15e-3 and run.config.model.d_model == 128
    assert run.config.model.layer_types[-1] == "attention"
    c.grid.tasks = tuple(hybrid.ZOOLOGY_LEARNING_RATES)  # the sweep's ends run on demand
    rates = {p.run.config.train.learning_rate for p in grid_points(c) if p.name.endswith("rope_rms-pre_s0")}
    assert rates == set(hybrid.ZOOLOGY_LEARNING_RATES.values())
