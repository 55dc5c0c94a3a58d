"""posenc.hf.checkpoint: a checkpoint is read a tensor at a time, so loading holds it about once.

The memory test loads a synthetic Llama checkpoint (bfloat16, 110 MB; its float32 model 220 MB) in a fresh
process: the resident peak over the memory before the load must stay under 1.6 times the model's bytes
(measured 1.33: the model, and its largest tensor (the 65 MB head) in flight twice, read and transposed).
Reading every tensor as float32 first, then placing and converting them, peaks at twice the model (2.02
here, and 2.01 at 4.7 GB: benchmarks/load_memory.py, docs/performance.md).
"""

import os

import numpy as np
import pytest

pytest.importorskip("safetensors")
from benchmarks import load_memory  # noqa: E402
from posenc import hf  # noqa: E402
from posenc.hf import checkpoint  # noqa: E402

DATA = os.path.join(os.path.dirname(__file__), "data", "hf_models")


def test_a_checkpoint_reads_nothing_until_asked_and_gives_the_stored_values(tmp_path):
    from safetensors.numpy import load_file, save_file

    save_file({"a": np.arange(6, dtype=np.float32).reshape(2, 3)}, str(tmp_path / "model-1.safetensors"))
    save_file({"b": np.array([1, 255], np.uint8)}, str(tmp_path / "model-2.safetensors"))
    c = hf.read_tensors(tmp_path)
    assert isinstance(c, checkpoint.Checkpoint) and sorted(c) == ["a", "b"] and len(c) == 2
    np.testing.assert_array_equal(c["a"], load_file(str(tmp_path / "model-1.safetensors"))["a"])
    assert c["b"].dtype == np.uint8 and c["b"].tolist() == [1, 255]  # packed MXFP4 bytes stay uint8
    v = checkpoint.View(c, {"x": "a"})
    assert list(v) == ["x"] and v["x"].shape == (2, 3)
    with pytest.raises(ValueError, match="has no \\*.safetensors file"):
        hf.read_tensors(tmp_path / "missing")


@pytest.mark.parametrize("family", ["llama", "gpt_oss_mxfp4", "bloom"])
def test_loading_reads_each_tensor_once(family, monkeypatch):
    reads: dict[str, int] = {}
    real = checkpoint.Checkpoint.__getitem__

    def counted(self, name):
        reads[name] = reads.get(name, 0) + 1
        return real(self, name)

    monkeypatch.setattr(checkpoint.Checkpoint, "__getitem__", counted)
    hf.load(os.path.join(DATA, family))
    names = set(checkpoint.Checkpoint(os.path.join(DATA, family)))
    assert set(reads) <= names and len(reads) >= len(names) - 2  # the ignored buffers (inv_freq) unread
    assert max(reads.values()) == 1, {k: n for k, n in reads.items() if n > 1}


def test_loading_peaks_near_the_model_size(tmp_path):
    d = str(tmp_path / "ckpt")
    load_memory.write_llama(d, layers=8, hidden=512, heads=8, kv_heads=2, head_dim=64, mlp=1408,
                            shard_bytes=40 << 20)
    row = load_memory.measure(d)
    assert row["model_bytes"] > 2 * row["checkpoint_bytes"] * 0.99  # float32 parameters of a bfloat16 file
    assert row["peak_over_model"] < 1.6, row


def test_a_parameter_the_family_does_not_place_is_an_error_not_zeros(monkeypatch):
    from posenc.hf import registry

    family = registry.FAMILIES["llama"]

    def without_final_norm(hf_cfg, tensors, spec):
        out = family.params(hf_cfg, tensors, spec)
        del out[("final_norm", "params", "scale")]
        return out

    monkeypatch.setitem(registry.FAMILIES, "llama", registry.Family(family.preset, family.fields, without_final_norm))
    with pytest.raises(ValueError, match="checkpoint lacks parameter final_norm.params.scale"):
        hf.load(os.path.join(DATA, "llama"))
