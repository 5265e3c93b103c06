"""Format details of a ``.onemodel`` file for ``onemodel inspect``, read from its fixed header."""

from __future__ import annotations

import os

from .format import _FIXED, MAGIC, NativeFormatError


def describe(path: str | os.PathLike) -> dict:
    with open(path, "rb") as f:
        head = f.read(_FIXED.size)
    if len(head) < _FIXED.size or not head.startswith(MAGIC):
        raise NativeFormatError(f"{path}: not a .onemodel file (bad magic or truncated header)")
    _, version, _flags, header_len, data_len, _, _ = _FIXED.unpack(head)
    return {"format_version": version, "header_bytes": header_len, "data_bytes": data_len}
