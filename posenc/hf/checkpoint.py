"""A checkpoint's tensors, read one at a time: host memory stays near the model's own size.

:class:`Checkpoint` is a read-only mapping from a tensor's name to its value
over the ``*.safetensors`` files of a directory. Only the files' headers are
read when it is made; a value is read from its file when it is asked for
(opened and closed again, so no mapping of the file stays resident), as
float32, or as stored for ``uint8`` tensors (MXFP4 blocks and scales, a
quarter of float32's memory: the family dequantizes them). The families
place each value as they take it (:class:`posenc.hf.hf_params.Tensors`), so
loading holds the placed parameters and one tensor in flight, never the
whole checkpoint twice.

:class:`View` renames or leaves out names of any such mapping (a plain dict
too) without reading a value.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator, Mapping

import numpy as np


class View(Mapping):
    """``base`` under other names: ``names`` maps each name of the view to the base's name."""

    def __init__(self, base: Mapping, names: dict[str, str]):
        self.base, self.names = base, dict(names)

    def __getitem__(self, name):
        return self.base[self.names[name]]

    def __contains__(self, name) -> bool:  # Mapping's own would read the value
        return name in self.names

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


def _as_loaded(value: np.ndarray) -> np.ndarray:
    # bf16 / fp16 through ml_dtypes to float32; packed uint8 kept
    return value if value.dtype == np.uint8 else np.asarray(value, np.float32)


class Checkpoint(Mapping):
    """The tensors of the ``*.safetensors`` files in ``model_dir``, each read when asked for."""

    def __init__(self, model_dir):
        from safetensors import safe_open

        self._safe_open = safe_open
        files = sorted(glob.glob(os.path.join(os.fspath(model_dir), "*.safetensors")))
        if not files:
            raise ValueError(f"{model_dir!s} has no *.safetensors file (convert .bin checkpoints with "
                             "transformers' save_pretrained(safe_serialization=True))")
        self.file_of: dict[str, str] = {}
        for path in files:
            with safe_open(path, framework="np") as f:
                for name in f.keys():
                    self.file_of[name] = path

    def __getitem__(self, name) -> np.ndarray:
        with self._safe_open(self.file_of[name], framework="np") as f:
            return _as_loaded(f.get_tensor(name))

    def __contains__(self, name) -> bool:  # Mapping's own would read the value
        return name in self.file_of

    def __iter__(self) -> Iterator[str]:
        return iter(self.file_of)

    def __len__(self) -> int:
        return len(self.file_of)
