"""Which JAX backends a run starts: on a host with no accelerator, only the CPU.

JAX tries every backend it finds installed. With libtpu installed (the
``crosscompile`` extra, or ``jax[tpu]``) on a host without a TPU, that try
prints libtpu's start-up errors to stderr ("Failed to find host bounds for
accelerator type", "unexpected worker hostname", a source-location trace)
before falling back to the CPU. :func:`cpu_only_without_accelerators` skips
the try where no TPU, GPU or other device is visible, so that a command's
stderr holds only its own lines. It changes nothing where an accelerator is
present, where the user chose the platforms (``JAX_PLATFORMS``,
``--jax_platforms``) or forced the TPU (``JAX_FORCE_TPU_INIT``), or on macOS
(whose Metal plugin shows no device file).
"""

from __future__ import annotations

import glob
import os
import sys

GOOGLE_PCI_VENDOR = "0x1ae0"  # TPU chips on a Cloud TPU VM (as jax's hardware_utils finds them)
GPU_DEVICE_FILES = ("/dev/nvidia0", "/dev/nvidiactl", "/dev/dxg", "/dev/kfd")  # NVIDIA, WSL2, ROCm


def visible_accelerator() -> str | None:
    """What shows an accelerator on this host (a device file or a Google PCI device), or None."""
    for path in GPU_DEVICE_FILES:
        if os.path.exists(path):
            return path
    for vendor in glob.glob("/sys/bus/pci/devices/*/vendor"):
        try:
            with open(vendor) as f:
                if f.read().strip() == GOOGLE_PCI_VENDOR:
                    return vendor
        except OSError:
            continue
    return None


def cpu_only_without_accelerators() -> bool:
    """Start only JAX's CPU backend if this host shows no accelerator and the user chose no
    platforms; True if it did. Call before the first JAX computation (importing jax is fine)."""
    import jax

    if (chosen_platforms() or "JAX_FORCE_TPU_INIT" in os.environ or sys.platform == "darwin"
            or visible_accelerator() is not None):
        return False
    jax.config.update("jax_platforms", "cpu")
    return True


def chosen_platforms() -> str:
    """The platforms the user chose (``JAX_PLATFORMS`` or ``--jax_platforms``), "" if none."""
    import jax

    return os.environ.get("JAX_PLATFORMS") or jax.config.jax_platforms or ""
