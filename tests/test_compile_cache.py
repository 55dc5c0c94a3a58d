"""The persistent compilation cache as the commands and the suite keep it (posenc.training.compile_cache)."""

import jax
import pytest

from posenc.training import compile_cache


def test_the_cache_orders_reads_and_writes_with_a_file_lock(tmp_path):
    """A size limit is what makes JAX lock the directory around every read and write: without one,
    a process can read an entry that another is still writing."""
    pytest.importorskip("filelock")
    before = {k: getattr(jax.config, k) for k in ("jax_compilation_cache_dir", "jax_compilation_cache_max_size")}
    try:
        compile_cache.enable_compilation_cache(str(tmp_path / "cache"))
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "cache")
        assert jax.config.jax_compilation_cache_max_size == compile_cache.MAX_BYTES > 0
    finally:
        for k, v in before.items():
            jax.config.update(k, v)
