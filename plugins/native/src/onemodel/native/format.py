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
``{"floats": [..]}``, ``{"strs": [..]}``, ``{"dtype": "F32"}``, ``{"none": true}``, and for
control flow ``{"graph": {..}}`` (a subgraph: ``name``, ``inputs``, ``outputs``, ``nodes`` and
``initializers`` as above, nested to at most ``MAX_DEPTH`` levels; its initializers' bytes are in
the same data section) and ``{"type": {..}}`` (the value type of an ``Optional``). An input or
output that is not a tensor has ``"kind"``: ``sequence``, ``optional`` or ``optional_sequence``.

Loading maps the file and builds the initializers as read-only views of it (no copy). Every
length is checked against the file size before anything is read, the header length against
``ONEMODEL_MAX_HEADER_BYTES`` before it is checksummed or parsed, both checksums are verified,
the header is parsed strictly and validated field by field, the node count is checked against
``ONEMODEL_MAX_NODES`` before any node is built, and the graph is validated as a whole; only then
is it returned. A truncated, corrupt, oversized or newer file raises ``NativeFormatError``
saying which.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from onemodel.runtime import Graph, GraphError, Node, ValueInfo
from onemodel.runtime.dims import dim_to_text, parse_dim
from onemodel.runtime.graph import VALUE_KINDS
from onemodel.runtime.guards import guards_from_list, guards_to_list
from onemodel.tensors import DType, OneModelError, TensorSpec
from onemodel.tensors.fileio import atomic_write, load_limit, read_json
from onemodel.tensors.ops.sequence import OptionalSpec, SequenceSpec

MAGIC = b"ONEMODEL"
VERSION = 1
_FIXED = struct.Struct("<8sIIQQII")
ALIGN = 64
MAX_DEPTH = 32  # subgraphs inside subgraphs


class NativeFormatError(OneModelError):
    """A .onemodel file is truncated, corrupt or of a newer version."""


def _pad(n: int) -> int:
    return -n % ALIGN


# saving -----------------------------------------------------------------------------------------

class _Data:
    """The data section being written: arrays at 64-byte aligned offsets."""

    def __init__(self):
        self.offset = 0
        self.arrays: list = []

    def add(self, arr) -> tuple[int, int]:
        arr = np.asarray(arr)
        data = np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<"), copy=False)
        self.offset += _pad(self.offset)
        at = self.offset
        self.arrays.append((at, data))
        self.offset += data.nbytes
        return at, data.nbytes


def _encode_graph(graph: Graph, out: _Data, depth: int = 0) -> dict:
    if depth > MAX_DEPTH:
        raise NativeFormatError(f"subgraphs are nested more than {MAX_DEPTH} levels deep")
    inits = []
    for name, arr in graph.initializers.items():
        at, nbytes = out.add(arr)
        inits.append({"name": name, "dtype": DType.from_numpy(np.asarray(arr).dtype).name,
                      "shape": list(np.shape(arr)), "offset": at, "nbytes": nbytes})
    return {
        "name": graph.name,
        "metadata": {str(k): str(v) for k, v in graph.metadata.items()},
        "inputs": [_value(v) for v in graph.inputs],
        "outputs": [_value(v) for v in graph.outputs],
        "nodes": [{"op": n.op, "name": n.name, "inputs": list(n.inputs),
                   "outputs": list(n.outputs),
                   "attrs": {k: _encode_attr(v, out, depth) for k, v in n.attrs.items()}}
                  for n in graph.nodes],
        "initializers": inits,
    }


def save(graph: Graph, path: str | os.PathLike) -> None:
    """Write ``graph`` to ``path`` atomically."""
    out = _Data()
    header = _encode_graph(graph, out)
    offset, arrays = out.offset, out.arrays
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
    out = {"name": v.name, "dtype": v.dtype.name, "shape": [dim_to_text(d) for d in v.shape]}
    if v.kind != "tensor":
        out["kind"] = v.kind
    return out


def _encode_type(t) -> dict:
    if isinstance(t, TensorSpec):
        return {"tensor": t.dtype.name, "shape": [dim_to_text(d) for d in t.shape]}
    if isinstance(t, SequenceSpec):
        return {"sequence": t.dtype.name if t.dtype is not None else None}
    if isinstance(t, OptionalSpec):
        return {"optional": None if t.inner is None else _encode_type(t.inner)}
    raise NativeFormatError(f"cannot store value type {t!r}")


def _encode_attr(v: Any, out: _Data | None = None, depth: int = 0) -> dict:
    if v is None:
        return {"none": True}
    if isinstance(v, Graph):
        return {"graph": _encode_graph(v, out if out is not None else _Data(), depth + 1)}
    if isinstance(v, (TensorSpec, SequenceSpec, OptionalSpec)):
        return {"type": _encode_type(v)}
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
        max_header = load_limit("HEADER_BYTES")
        if hlen > max_header and _FIXED.size + hlen + dlen == size:
            raise NativeFormatError(
                f"{path}: the header is {hlen} bytes, more than the limit of {max_header}; "
                "raise ONEMODEL_MAX_HEADER_BYTES if this model is genuine")
        if _FIXED.size + hlen + dlen != size:
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
    raw = bytes(raw)
    # every node has an "op" key, and a quote inside a JSON string is escaped: an upper bound
    # on the node count, before parsing
    limit = load_limit("NODES")
    if raw.count(b'"op":') > limit:
        raise NativeFormatError(f"{path}: the graph has more than {limit} nodes (the limit); "
                                "raise ONEMODEL_MAX_NODES if this model is genuine")
    try:
        header = read_json(raw, "header", allow_nonfinite=True)
        graph = _decode(header, mm, _FIXED.size + hlen, dlen)
        graph.guards = guards_from_list(header.get("guards", []))
    except NativeFormatError as exc:
        raise NativeFormatError(f"{path}: {exc}") from None
    except OneModelError as exc:
        raise NativeFormatError(f"{path}: corrupt header ({exc})") from None
    except KeyError as exc:
        raise NativeFormatError(f"{path}: corrupt header: the field {exc} is missing") from None
    except (ValueError, TypeError, AttributeError, ArithmeticError) as exc:
        raise NativeFormatError(f"{path}: corrupt header ({type(exc).__name__}: {exc})") from None
    try:
        graph.validate(allow_unknown=True)
    except GraphError as exc:
        raise NativeFormatError(f"{path}: the stored graph is invalid: {exc}") from None
    return graph


def _list(v, what: str) -> list:
    if not isinstance(v, list):
        raise NativeFormatError(f"corrupt header: {what} is not a list")
    return v


def _dict(v, what: str) -> dict:
    if not isinstance(v, dict):
        raise NativeFormatError(f"corrupt header: {what} is not a table")
    return v


def _str(v, what: str) -> str:
    if not isinstance(v, str):
        raise NativeFormatError(f"corrupt header: {what} is not text")
    return v


def _count(v, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 1 << 62:
        raise NativeFormatError(f"corrupt header: {what} is not a count ({v!r})")
    return v


def _dtype(v, what: str) -> DType:
    if not isinstance(v, str) or v not in DType.__members__:
        raise NativeFormatError(f"corrupt header: {what} has unknown dtype {v!r}")
    return DType[v]


def _decode(h: dict, mm: mmap.mmap, data_start: int, dlen: int, depth: int = 0) -> Graph:
    if depth > MAX_DEPTH:
        raise NativeFormatError(f"corrupt header: subgraphs nested more than {MAX_DEPTH} deep")
    h = _dict(h, "the header")
    raw_nodes = _list(h["nodes"], "nodes")
    limit = load_limit("NODES")
    if len(raw_nodes) > limit:  # the header may use spaces the count before parsing missed
        raise NativeFormatError(f"the graph has {len(raw_nodes)} nodes, more than the limit of "
                                f"{limit}; raise ONEMODEL_MAX_NODES if this model is genuine")
    inits = {}
    for e in _list(h["initializers"], "initializers"):
        e = _dict(e, "an initializer")
        name = _str(e["name"], "an initializer name")
        dt = _dtype(e["dtype"], f"initializer {name!r}")
        shape = tuple(_count(d, f"a dimension of {name!r}") for d in _list(e["shape"], "shape"))
        off, nbytes = _count(e["offset"], "an offset"), _count(e["nbytes"], "a length")
        count = math.prod(shape)
        if nbytes != count * dt.itemsize:
            raise NativeFormatError(f"corrupt entry for initializer {name!r}")
        if off + nbytes > dlen:
            raise NativeFormatError(f"truncated: initializer {name!r} ends at byte "
                                    f"{off + nbytes} of a {dlen}-byte data section")
        arr = np.frombuffer(mm, dtype=dt.numpy.newbyteorder("<"), count=count,
                            offset=data_start + off).reshape(shape)
        inits[name] = arr if arr.dtype == dt.numpy else arr.astype(dt.numpy)
    ctx = (mm, data_start, dlen, depth)
    nodes = [_node(_dict(n, "a node"), ctx) for n in raw_nodes]
    meta = _dict(h.get("metadata", {}), "metadata")
    return Graph([_value_info(v) for v in _list(h["inputs"], "inputs")],
                 [_value_info(v) for v in _list(h["outputs"], "outputs")],
                 nodes, inits, {str(k): _str(v, f"metadata {k!r}") for k, v in meta.items()},
                 _str(h.get("name", ""), "the graph name"))


def _node(n: dict, ctx) -> Node:
    op = _str(n["op"], "an op name")
    name = _str(n.get("name", ""), "a node name")
    inputs, outputs = _strs(n["inputs"], name, "inputs"), _strs(n["outputs"], name, "outputs")
    attrs = _dict(n["attrs"], "attrs")
    return Node(op, inputs, outputs, {k: _decode_attr(v, ctx) for k, v in attrs.items()}, name)


def _strs(v, node: str, what: str) -> list[str]:
    if type(v) is not list or not all(type(x) is str for x in v):
        raise NativeFormatError(f"corrupt header: the {what} of node {node!r} are not a list "
                                "of text")
    return v


def _value_info(v: dict) -> ValueInfo:
    v = _dict(v, "an input or output")
    kind = _str(v.get("kind", "tensor"), "a value kind")
    if kind not in VALUE_KINDS:
        raise NativeFormatError(f"corrupt header: unknown value kind {kind!r}")
    return ValueInfo(_str(v["name"], "a value name"), _dtype(v["dtype"], "a value"),
                     tuple(parse_dim(d) for d in _list(v["shape"], "shape")), kind)


def _decode_type(t, depth: int = 0):
    t = _dict(t, "a value type")
    if depth > MAX_DEPTH or len(t) not in (1, 2):
        raise NativeFormatError(f"corrupt value type {t!r}")
    if "tensor" in t:
        return TensorSpec(tuple(parse_dim(d) for d in _list(t.get("shape", []), "shape")),
                          _dtype(t["tensor"], "a value type"))
    if "sequence" in t:
        return SequenceSpec(None if t["sequence"] is None
                            else _dtype(t["sequence"], "a sequence type"), None)
    if "optional" in t:
        inner = t["optional"]
        return OptionalSpec(None if inner is None else _decode_type(inner, depth + 1), None)
    raise NativeFormatError(f"corrupt value type {t!r}")


def _decode_attr(v: dict, ctx=None):
    if not isinstance(v, dict) or len(v) != 1:
        raise NativeFormatError(f"corrupt attribute {v!r}")
    (tag, value), = v.items()
    if tag == "none":
        return None
    if tag == "graph" and ctx is not None:
        mm, data_start, dlen, depth = ctx
        return _decode(value, mm, data_start, dlen, depth + 1)
    if tag == "type":
        return _decode_type(value)
    if tag == "b" and isinstance(value, bool):
        return value
    if tag == "i":
        return _int(value)
    if tag == "f":
        return _float(value)
    if tag == "s":
        return _str(value, "a text attribute")
    if tag == "dtype":
        return _dtype(value, "an attribute")
    if tag == "ints":
        return tuple(_int(x) for x in _list(value, "ints"))
    if tag == "floats":
        return tuple(_float(x) for x in _list(value, "floats"))
    if tag == "strs":
        return tuple(_str(x, "a text attribute") for x in _list(value, "strs"))
    if tag in ("b", "i", "f", "s", "dtype", "ints", "floats", "strs"):
        raise NativeFormatError(f"corrupt attribute {v!r}")
    raise NativeFormatError(f"unknown attribute tag {tag!r} (written by a newer version?)")


def _int(v) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise NativeFormatError(f"corrupt attribute: {v!r} is not an integer")
    return v


def _float(v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise NativeFormatError(f"corrupt attribute: {v!r} is not a number")
    return float(v)
