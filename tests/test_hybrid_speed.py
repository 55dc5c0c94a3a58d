"""benchmarks/hybrid_speed.py's chunk flags: each model gets the chunk of the layer kinds it has (a model
without the kind would refuse the option), and the config resolves."""

import argparse

from benchmarks import hybrid_speed, workload


def test_chunk_flags_reach_only_the_models_with_that_layer_kind():
    args = argparse.Namespace(mamba2_chunk=32, gdn_chunk=16)
    assert hybrid_speed.chunk_overrides(args, "attention") == {}
    assert hybrid_speed.chunk_overrides(args, "mamba2_3to1") == {"model.recurrent.mamba2.chunk_size": 32}
    assert hybrid_speed.chunk_overrides(args, "gdn_only") == {"model.recurrent.gated_deltanet.chunk_size": 16}
    for name in ("attention", "mamba2_3to1", "gdn_3to1"):
        c = hybrid_speed.config(name, d_model=64, layers=4, length=32, batch=2,
                                chunks=hybrid_speed.chunk_overrides(args, name))
        workload.train_spec(c)  # resolves the model: an option no layer reads would raise here
        if name == "mamba2_3to1":
            assert c.model.recurrent.mamba2.chunk_size == 32
        if name == "gdn_3to1":
            assert c.model.recurrent.gated_deltanet.chunk_size == 16
