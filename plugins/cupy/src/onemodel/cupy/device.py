"""The ``"cuda"`` device: CuPy arrays on the current GPU.

The registry names these functions lazily (``"onemodel.cupy.device:to_device"``), so nothing
here runs, and CuPy is not imported, until a tensor is placed on the device.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np


@functools.cache
def available() -> bool:
    """True when CuPy imports and sees at least one CUDA device (False without CuPy, without a
    driver, or without a GPU); asked once per process."""
    try:
        import cupy
    except Exception:  # ImportError, or a CuPy build whose CUDA libraries are missing
        return False
    try:
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # cupy.cuda.runtime.CUDARuntimeError: no driver or no device
        return False


def __getattr__(name: str) -> Any:
    """``xp``: the array namespace of this device's arrays, the ``cupy`` module, imported on
    first use (the backend registers it as ``"onemodel.cupy.device:xp"``)."""
    if name == "xp":
        import cupy

        return cupy
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def to_device(array: np.ndarray) -> Any:
    """A host array copied to the current GPU."""
    import cupy

    return cupy.asarray(array)


def to_host(array: Any) -> np.ndarray:
    """A device array copied to host memory (waits for the work that writes it)."""
    import cupy

    if isinstance(array, np.ndarray):
        return array
    return cupy.asnumpy(array)


def synchronize() -> None:
    """Wait for every kernel queued on the current stream (timing, before host reads)."""
    import cupy

    cupy.cuda.get_current_stream().synchronize()
