"""compare:hybrid_quick: position from recurrence against position in attention, every point validated."""

from __future__ import annotations

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
