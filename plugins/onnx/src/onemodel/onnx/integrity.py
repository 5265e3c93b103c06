"""A checksum of an ONNX model's initializers.

ONNX has no checksum, so flipped weight bytes would load silently. OneModel's exporter records a
CRC-32 of the initializers (names, dtypes, shapes and bytes, by name) in ``metadata_props`` under
``KEY``; the importer verifies it when it is present. A tool that changes the weights of such a
file must drop the entry (or the importer refuses the file, saying so).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable

import numpy as np

KEY = "onemodel.initializers_crc32"


def initializers_crc(items: Iterable[tuple[str, np.ndarray]]) -> str:
    """CRC-32 (8 hex digits) of ``(name, array)`` pairs, independent of their order."""
    crc = 0
    for name, arr in sorted(items, key=lambda kv: kv[0]):
        a = np.ascontiguousarray(arr)
        a = a.astype(a.dtype.newbyteorder("<"), copy=False) if a.dtype.byteorder == ">" else a
        crc = zlib.crc32(f"{name}\0{a.dtype.str}\0{list(a.shape)}\0".encode(), crc)
        crc = zlib.crc32(a.reshape(-1).view(np.uint8), crc)
    return f"{crc:08x}"
