"""Shared test settings: small, deterministic, CPU-friendly."""

import os
import signal

# Keep XLA from grabbing every core per test process and from preallocating.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "posenc",
    max_examples=25,
    deadline=None,
    derandomize=True,  # same examples every run: CI failures reproduce locally
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile("posenc")

import plugin_encodings  # noqa: E402,F401  (registers the test plugin encoding)

# The persistent compilation cache of the commands (posenc.training.compile_cache): a second
# test run loads the train and evaluation programs instead of compiling them.
# POSENC_JAX_CACHE_DIR= (empty) turns it off.
from posenc.training.compile_cache import default_cache_dir, enable_compilation_cache  # noqa: E402

enable_compilation_cache(default_cache_dir())


@pytest.fixture
def python_sigint():
    """Python's own SIGINT handler for the test (KeyboardInterrupt), whatever the suite started with: a
    suite started in the background by a non-interactive shell inherits SIGINT ignored, and then a
    signal sent to the process, or ``_thread.interrupt_main``, does nothing."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)
