"""The ``.onemodel`` file format, version 1.

Layout (all integers little-endian)::

    offset  size  field
    0       8     magic b"ONEMODEL"
    8       4     format version (u32)
    12      4     flags (u32, 0)
    16      8     header length H (u64)
    24      8     data length D (u64)
    32      4     CRC-32 of the header
    36      4     CRC-32 of the data
    40      H     header: UTF-8 JSON (the graph), padded with spaces so the data starts at a
                  multiple of 64
    40+H    D     data: the initializers' bytes, each starting at a multiple of 64

The JSON header holds ``name``, ``metadata`` (string -> string), ``inputs`` and ``outputs``
(``name``, ``dtype``, ``shape`` with ints and symbol text such as ``"batch"``), ``nodes`` (``op``,
``name``, ``inputs``, ``outputs``, ``attrs``) and ``initializers`` (``name``, ``dtype``,
``shape``, ``offset`` into the data, ``nbytes``). Attribute values are tagged:
``{"i": 1}``, ``{"f": 0.5}``, ``{"s": "Relu"}``, ``{"b": true}``, ``{"ints": [..]}``,
``{"floats": [..]}``, ``{"strs": [..]}``, ``{"dtype": "F32"}``, ``{"none": true}``.

Loading maps the file and builds the initializers as read-only views of it (no copy). Every
length is checked against the file size before anything is read, both checksums are verified,
the header is validated field by field, and the graph is validated as a whole; only then is it
returned. A truncated, corrupt or newer file raises ``NativeFormatError`` saying which.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from onemodel.runtime import Graph, GraphError, Node, ValueInfo
from onemodel.runtime.dims import dim_to_text, parse_dim
from onemodel.runtime.guards import guards_from_list, guards_to_list
from onemodel.tensors import DType, OneModelError
from onemodel.tensors.fileio import atomic_write

MAGIC = b"ONEMODEL"
VERSION = 1
_FIXED = struct.Struct("<8sIIQQII")
ALIGN = 64
_MAX_HEADER = 256 * 1024 * 1024


class NativeFormatError(OneModelError):
    """A .onemodel file is truncated, corrupt or of a newer version."""


def _pad(n: int) -> int:
    return -n % ALIGN


# saving -----------------------------------------------------------------------------------------

def save(graph: Graph, path: str | os.PathLike) -> None:
    """Write ``graph`` to ``path`` atomically."""
    inits, offset = [], 0
    arrays = []
    for name, arr in graph.initializers.items():
        arr = np.asarray(arr)
        data = np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<"), copy=False)
        offset += _pad(offset)
        inits.append({"name": name, "dtype": DType.from_numpy(arr.dtype).name,
                      "shape": list(arr.shape), "offset": offset, "nbytes": data.nbytes})
        arrays.append((offset, data))
        offset += data.nbytes
    header = {
        "name": graph.name,
        "metadata": {str(k): str(v) for k, v in graph.metadata.items()},
        "inputs": [_value(v) for v in graph.inputs],
        "outputs": [_value(v) for v in graph.outputs],
        "nodes": [{"op": n.op, "name": n.name, "inputs": list(n.inputs),
                   "outputs": list(n.outputs),
                   "attrs": {k: _encode_attr(v) for k, v in n.attrs.items()}} for n in graph.nodes],
        "initializers": inits,
    }
    if graph.guards:  # conditions on sizes the traced graph holds under; older files have none
        header["guards"] = guards_to_list(graph.guards)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * _pad(_FIXED.size + len(raw))
    data = bytearray(offset)
    for off, arr in arrays:
        data[off : off + arr.nbytes] = arr.tobytes()
    fixed = _FIXED.pack(MAGIC, VERSION, 0, len(raw), len(data), zlib.crc32(raw),
                        zlib.crc32(data))
    atomic_write(path, [fixed, raw, bytes(data)])


def _value(v: ValueInfo) -> dict:
    return {"name": v.name, "dtype": v.dtype.name, "shape": [dim_to_text(d) for d in v.shape]}


def _encode_attr(v: Any) -> dict:
    if v is None:
        return {"none": True}
    if isinstance(v, bool):
        return {"b": v}
    if isinstance(v, DType):
        return {"dtype": v.name}
    if isinstance(v, (int, np.integer)):
        return {"i": int(v)}
    if isinstance(v, (float, np.floating)):
        return {"f": float(v)}
    if isinstance(v, str):
        return {"s": v}
    if isinstance(v, (tuple, list)):
        if all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in v):
            return {"ints": [int(x) for x in v]}
        if all(isinstance(x, (int, float, np.number)) for x in v):
            return {"floats": [float(x) for x in v]}
        if all(isinstance(x, str) for x in v):
            return {"strs": list(v)}
    raise NativeFormatError(f"cannot store attribute value {v!r} ({type(v).__name__})")


# loading ----------------------------------------------------------------------------------------

def load(path: str | os.PathLike) -> Graph:
    path = Path(path)
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed by the with-block below
    except FileNotFoundError:
        raise NativeFormatError(f"{path}: no such file") from None
    with f:
        size = os.fstat(f.fileno()).st_size
        if size < _FIXED.size:
            raise NativeFormatError(f"{path}: truncated ({size} bytes; the fixed header alone "
                                    f"is {_FIXED.size})")
        magic, version, _flags, hlen, dlen, hcrc, dcrc = _FIXED.unpack(f.read(_FIXED.size))
        if magic != MAGIC:
            raise NativeFormatError(f"{path}: not a .onemodel file (bad magic bytes)")
        if version > VERSION:
            raise NativeFormatError(f"{path}: format version {version} is newer than this "
                                    f"onemodel-native reads ({VERSION}); upgrade onemodel-native")
        if version < 1:
            raise NativeFormatError(f"{path}: corrupt header (format version {version})")
        if hlen > _MAX_HEADER or _FIXED.size + hlen + dlen != size:
            raise NativeFormatError(
                f"{path}: truncated or corrupt: the header says {_FIXED.size + hlen + dlen} "
                f"bytes, the file has {size}"
            )
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    view = memoryview(mm)
    raw = view[_FIXED.size : _FIXED.size + hlen]
    data = view[_FIXED.size + hlen :]
    if zlib.crc32(raw) != hcrc:
        raise NativeFormatError(f"{path}: corrupt: the header checksum does not match")
    if zlib.crc32(data) != dcrc:
        raise NativeFormatError(f"{path}: corrupt: the data checksum does not match")
    try:
        header = json.loads(bytes(raw))
        graph = _decode(header, mm, _FIXED.size + hlen, dlen)
        graph.guards = guards_from_list(header.get("guards", []))
    except NativeFormatError as exc:
        raise NativeFormatError(f"{path}: {exc}") from None
    except (ValueError, TypeError, KeyError, AttributeError, OneModelError) as exc:
        raise NativeFormatError(f"{path}: corrupt header ({type(exc).__name__}: {exc})") from None
    try:
        graph.validate(allow_unknown=True)
    except GraphError as exc:
        raise NativeFormatError(f"{path}: the stored graph is invalid: {exc}") from None
    return graph


def _decode(h: dict, mm: mmap.mmap, data_start: int, dlen: int) -> Graph:
    if not isinstance(h, dict):
        raise NativeFormatError("corrupt header: not a JSON object")
    inits = {}
    for e in h["initializers"]:
        dt = DType[e["dtype"]]
        shape = tuple(int(d) for d in e["shape"])
        off, nbytes = int(e["offset"]), int(e["nbytes"])
        count = int(np.prod(shape, dtype=np.int64))
        if any(d < 0 for d in shape) or off < 0 or nbytes != count * dt.itemsize:
            raise NativeFormatError(f"corrupt entry for initializer {e['name']!r}")
        if off + nbytes > dlen:
            raise NativeFormatError(f"truncated: initializer {e['name']!r} ends at byte "
                                    f"{off + nbytes} of a {dlen}-byte data section")
        arr = np.frombuffer(mm, dtype=dt.numpy.newbyteorder("<"), count=count,
                            offset=data_start + off).reshape(shape)
        inits[str(e["name"])] = arr if arr.dtype == dt.numpy else arr.astype(dt.numpy)
    nodes = [Node(str(n["op"]), [str(i) for i in n["inputs"]], [str(o) for o in n["outputs"]],
                  {str(k): _decode_attr(v) for k, v in n["attrs"].items()}, str(n.get("name", "")))
             for n in h["nodes"]]
    meta = h.get("metadata", {})
    if not isinstance(meta, dict):
        raise NativeFormatError("corrupt metadata")
    return Graph([_value_info(v) for v in h["inputs"]], [_value_info(v) for v in h["outputs"]],
                 nodes, inits, {str(k): str(v) for k, v in meta.items()}, str(h.get("name", "")))


def _value_info(v: dict) -> ValueInfo:
    return ValueInfo(str(v["name"]), DType[v["dtype"]], tuple(parse_dim(d) for d in v["shape"]))


def _decode_attr(v: dict):
    if not isinstance(v, dict) or len(v) != 1:
        raise NativeFormatError(f"corrupt attribute {v!r}")
    (tag, value), = v.items()
    if tag == "none":
        return None
    if tag == "b":
        return bool(value)
    if tag == "i":
        return int(value)
    if tag == "f":
        return float(value)
    if tag == "s":
        return str(value)
    if tag == "dtype":
        return DType[value]
    if tag == "ints":
        return tuple(int(x) for x in value)
    if tag == "floats":
        return tuple(float(x) for x in value)
    if tag == "strs":
        return tuple(str(x) for x in value)
    raise NativeFormatError(f"unknown attribute tag {tag!r} (written by a newer version?)")
