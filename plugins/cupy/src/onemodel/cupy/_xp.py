"""The array namespace of a call: ``cupy`` for CuPy arrays, ``numpy`` otherwise.

Every kernel of this plugin is written once against ``xp`` and asks :func:`namespace` which
module its data inputs belong to, so the same code runs on a GPU (registered for ``"cuda"``) and
with numpy on the CPU (the plugin's CPU tests compare it with the reference kernels there).
CuPy is imported only when a CuPy array is seen.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from onemodel.tensors.errors import OneModelError

DEVICE = "cuda"


def is_device_array(a: Any) -> bool:
    return type(a).__module__.startswith("cupy")


def namespace(*arrays: Any):
    """``cupy`` when one of ``arrays`` is a CuPy array, else ``numpy``."""
    for a in arrays:
        if a is not None and is_device_array(a):
            return sys.modules["cupy"]  # a CuPy array exists: CuPy is imported
    return np


def scalar(value: float, dtype) -> Any:
    """``value`` as a numpy scalar of ``dtype``: both numpy and CuPy keep the array's dtype
    when it meets one (a 0-d numpy array would not mix with CuPy arrays)."""
    return np.dtype(dtype).type(value)


# dtypes CuPy arrays can hold (no bfloat16, 8-bit floats or sub-byte integers)
DEVICE_DTYPES = frozenset(np.dtype(t) for t in (
    np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
    np.float16, np.float32, np.float64))


def check_device_dtype(dtype, what: str) -> None:
    if np.dtype(dtype) not in DEVICE_DTYPES:
        raise OneModelError(
            f"{what}: dtype {dtype} cannot be held by a CuPy array on device {DEVICE!r}; do "
            "this step on the CPU (tensor.cpu()) or in a dtype CuPy has (float16/32/64, "
            "integers, bool)")
