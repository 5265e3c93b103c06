"""ONNX ModelProto -> Graph.

Models from opset 7 on are brought to the op set's semantics (its latest ONNX forms) by the
import adapters each op declares beside its definition (``onemodel.tensors.ops.adapters``:
attributes that later opsets turned into inputs, Softmax's pre-13 flattening, a Cast's element
type); attributes of old opsets that carry no meaning are dropped here. IR < 4
models that list initializers as graph inputs are handled as ONNX Runtime does: an input with an
initializer is a constant. ``dim_param`` axes become symbols. External data files are read from
beside the model.

Hostile files end in a ``OneModelError``: a model must have a graph with outputs, its node count
is bounded (``ONEMODEL_MAX_NODES``) before conversion, every tensor's dtype and data length are
checked before it is decoded, text must be UTF-8, constants built from a shape are bounded
(``ONEMODEL_MAX_CONSTANT_ELEMENTS``) before they are allocated, and the initializer checksum a
OneModel export records is verified.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from onemodel.runtime import Graph, Node, ValueInfo
from onemodel.runtime.guards import METADATA_KEY, guards_from_list
from onemodel.tensors import OneModelError
from onemodel.tensors.fileio import load_limit, read_json
from onemodel.tensors.ops import OPS
from onemodel.tensors.ops.adapters import ImportNode, adapters_for

from . import subgraphs
from .dtypes import from_onnx, raw_nbytes
from .integrity import KEY, initializers_crc


class UnsupportedOpError(OneModelError):
    """The model uses an op the runtime does not have."""


# attributes of older opsets that carry no meaning any more (dropped unless the op declares them)
_LEGACY = {"consumed_inputs", "is_test", "spatial", "saturate"}


class OnnxFormatError(OneModelError):
    """An ONNX file is not a model OneModel can read: no graph, corrupt tensors, bad text..."""


def load(path: str | os.PathLike) -> Graph:
    import onnx
    from onnx.external_data_helper import load_external_data_for_model

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:
        raise OnnxFormatError(f"{path}: not a readable ONNX model ({type(exc).__name__}: "
                              f"{exc})") from None
    try:
        _check_size(model)  # before external data is read: that walks every tensor
        try:
            load_external_data_for_model(model, str(Path(path).parent))
        except Exception as exc:
            raise OnnxFormatError(f"its external data cannot be read ({type(exc).__name__}: "
                                  f"{exc})") from None
        return from_model(model, Path(path).stem)
    except OneModelError as exc:
        raise type(exc)(f"{path}: {exc}") from None


def _check_size(model) -> None:
    """A graph with outputs and at most ONEMODEL_MAX_NODES nodes, checked before any work."""
    if not model.HasField("graph"):
        raise OnnxFormatError("not an ONNX model: it has no graph (an empty or foreign file?)")
    g = model.graph
    if not g.output:
        raise OnnxFormatError(f"the graph {_text(g.name, 'the graph name')!r} has no outputs")
    limit = load_limit("NODES")
    if len(g.node) > limit:
        raise OnnxFormatError(f"the graph has {len(g.node)} nodes, more than the limit of "
                              f"{limit}; raise ONEMODEL_MAX_NODES if this model is genuine")


def from_model(model, name: str = "graph") -> Graph:
    """Convert a parsed ``onnx.ModelProto``; every problem is a ``OneModelError``."""
    _check_size(model)
    g = model.graph
    opset = next((o.version for o in model.opset_import
                  if _text(o.domain, "an opset domain") in ("", "ai.onnx")), 0)
    inits = {}
    for t in g.initializer:
        tname = _text(t.name, "an initializer name")
        inits[tname] = _to_array(t, f"initializer {tname!r}")
    meta = {_text(p.key, "a metadata key"): _text(p.value, f"metadata {p.key!r}")
            for p in model.metadata_props}
    _verify_checksum(meta, inits)
    counter = [0]

    def fresh(base):
        counter[0] += 1
        return f"{base}__{counter[0]}"

    unknown = [0]
    inputs = []
    for v in g.input:
        if v.name in inits:
            continue  # IR < 4: an initializer listed as an input is a constant (as in ORT)
        inputs.append(_value_info(v, unknown))
    outputs = [_value_info(v, unknown) for v in g.output]
    graph = Graph(inputs, outputs, [], {}, meta, _text(g.name, "the graph name") or name)
    graph.metadata.setdefault("producer", _text(model.producer_name, "the producer name"))
    for k, arr in inits.items():
        graph.initializers[k] = arr
    for node in g.node:
        _convert(node, opset, graph, fresh)
    text = graph.metadata.pop(METADATA_KEY, "[]")
    try:
        graph.guards = guards_from_list(read_json(text, f"metadata {METADATA_KEY!r}"))
    except ArithmeticError as exc:  # a hostile guard's arithmetic (an int too large for a float)
        raise OnnxFormatError(f"the guards in metadata {METADATA_KEY!r} cannot be read "
                              f"({type(exc).__name__}: {exc})") from None
    graph.validate(allow_unknown=True)
    return graph


def _text(value, what: str) -> str:
    """A protobuf string field; proto2 hands back bytes when they are not valid UTF-8."""
    if isinstance(value, bytes):
        raise OnnxFormatError(f"{what} is not valid UTF-8 text ({value[:40]!r})")
    return value


def _to_array(t, what: str) -> np.ndarray:
    """Decode a TensorProto after checking its dtype, dims and data length (no large allocation
    happens before the length is known to match)."""
    from onnx import TensorProto, numpy_helper

    dtype = from_onnx(t.data_type, what)
    dims = list(t.dims)
    if any(d < 0 for d in dims):
        raise OnnxFormatError(f"{what} has a negative dimension {dims}")
    count = math.prod(dims)
    if t.data_location == TensorProto.EXTERNAL:
        raise OnnxFormatError(f"{what} has external data that was not loaded (load the model "
                              "from its file, beside its data files)")
    # 4- and 2-bit types are packed, two or four to a byte (and so to a typed-field value)
    packed = raw_nbytes(dtype, count) if dtype.bits < 8 else None
    if t.HasField("raw_data"):
        need = packed if packed is not None else count * dtype.itemsize
        if len(t.raw_data) != need:
            raise OnnxFormatError(f"{what} holds {len(t.raw_data)} bytes, its shape {dims} and "
                                  f"dtype {dtype.name} need {need}")
    else:
        stored = max(len(t.float_data), len(t.int32_data), len(t.int64_data),
                     len(t.double_data), len(t.uint64_data))
        need = packed if packed is not None else count
        if stored != need:
            raise OnnxFormatError(f"{what} holds {stored} values, its shape {dims} needs {need}")
    try:
        arr = numpy_helper.to_array(t)
    except Exception as exc:  # onnx raises assorted types on malformed tensors
        raise OnnxFormatError(f"{what} cannot be decoded ({type(exc).__name__}: {exc})") \
            from None
    if arr.dtype != dtype.numpy or arr.shape != tuple(dims):
        raise OnnxFormatError(f"{what} decodes to {arr.dtype}{list(arr.shape)}, not "
                              f"{dtype.name}{dims}")
    return arr


def _verify_checksum(meta: dict, inits: dict) -> None:
    """Check (and drop from the metadata) the initializer checksum OneModel's export records."""
    expected = meta.pop(KEY, None)
    if expected is None:
        return
    actual = initializers_crc(inits.items())
    if actual != expected.strip().lower():
        raise OnnxFormatError(
            f"corrupt: the initializers do not match the checksum OneModel recorded when it "
            f"wrote this file (metadata {KEY} = {expected}, the weights give {actual}); the "
            f"file was damaged, or a tool changed the weights and kept that entry (remove the "
            f"entry to load such a file)")


def _value_info(v, unknown) -> ValueInfo:
    """A graph input or output: a tensor (``dim_param`` axes become symbols, axes without a
    size fresh ``unk__N`` symbols), a sequence of tensors, or an optional tensor or sequence."""
    return subgraphs.value_info(v, unknown, _text)


def _attrs(node, label: str) -> dict:
    from onnx import helper

    out = {}
    for a in node.attribute:
        key = _text(a.name, f"{label}: an attribute name")
        try:
            v = helper.get_attribute_value(a)
            if isinstance(v, bytes):
                v = v.decode()
            elif isinstance(v, list):
                v = tuple(x.decode() if isinstance(x, bytes) else x for x in v)
        except (UnicodeDecodeError, ValueError, TypeError) as exc:
            raise OnnxFormatError(f"{label}: attribute {key!r} cannot be read "
                                  f"({type(exc).__name__}: {exc})") from None
        out[key] = v
    return out


def _need(inputs: list[str], count: int, label: str, op: str) -> None:
    """Adapters read inputs by position: refuse a node that lacks them first."""
    if len(inputs) < count or not all(inputs[:count]):
        raise OnnxFormatError(f"{label}: {op} needs {count} input(s), the node gives "
                              f"{[i for i in inputs if i] or 'none'}")


def _const(graph: Graph, fresh, values, dtype=np.int64) -> str:
    name = fresh("const")
    graph.initializers[name] = np.asarray(values, dtype=dtype)
    return name


def _convert(node, opset: int, graph: Graph, fresh, depth: int = 0) -> None:
    op = _text(node.op_type, "an op type")
    domain = _text(node.domain, f"the domain of a {op} node") or "ai.onnx"
    # a node without a name gets the generated one it will carry in the graph (Range__17), so
    # an error at load or plan time names the same node
    name = _text(node.name, f"the name of a {op} node") or fresh(op)
    label = (f"node {name} ({op}, domain "
             f"{domain}, opset {opset})")
    inputs = [_text(i, f"{label}: an input name") for i in node.input]
    outputs = [_text(o, f"{label}: an output name") for o in node.output]
    if domain not in ("ai.onnx", ""):
        raise UnsupportedOpError(f"{label}: domain {domain!r} is not supported")
    attrs = _attrs(node, label)
    try:
        # subgraphs (If, Loop, Scan, SequenceMap) converted, their outer-scope reads made inputs
        inputs, attrs = subgraphs.convert_attrs(op, label, inputs, attrs, opset, fresh, _convert,
                                                _to_array, depth)
        _convert_node(node, op, name, label, inputs, outputs, attrs, opset, graph, fresh)
    except OneModelError:
        raise
    except (IndexError, KeyError, ValueError, TypeError, AttributeError, ArithmeticError) as exc:
        # a malformed node that no specific check above caught: still name it
        raise OnnxFormatError(f"{label}: malformed node ({type(exc).__name__}: {exc})") \
            from None


def _constant(node, label: str, attrs: dict) -> np.ndarray:
    if len(attrs) != 1:
        raise OnnxFormatError(f"{label}: a Constant needs exactly one value attribute, it has "
                              f"{len(attrs)} ({', '.join(attrs) or 'none'})")
    (key, value), = attrs.items()
    if key == "value":
        return _to_array(node.attribute[0].t, f"{label} value")
    if key in ("value_float", "value_floats"):
        return np.asarray(value, np.float32)
    if key in ("value_int", "value_ints"):
        return np.asarray(value, np.int64)
    raise UnsupportedOpError(f"{label}: Constant with {key} is not supported")


def _constant_of_shape(node, name: str, label: str, inputs, outputs, attrs, graph: Graph,
                       fresh) -> None:
    """Folded on import when its shape is a constant (weights of the model-zoo files); the
    element count is checked against ONEMODEL_MAX_CONSTANT_ELEMENTS before allocating. A shape
    computed at run time (from Shape ops) becomes ``Expand`` of the 0-d value to that shape:
    the same result, planned once the shape's value is known."""
    _need(inputs, 1, label, "ConstantOfShape")
    if set(attrs) - {"value"}:
        raise UnsupportedOpError(f"{label}: attribute {sorted(set(attrs) - {'value'})[0]!r} of "
                                 "ConstantOfShape is not supported")
    value = (_to_array(node.attribute[0].t, f"{label} value") if attrs
             else np.zeros(1, np.float32))
    if value.size != 1:
        raise OnnxFormatError(f"{label}: the value of a ConstantOfShape must hold one element, "
                              f"it holds {value.size}")
    if inputs[0] not in graph.initializers:
        scalar = fresh("const")
        graph.initializers[scalar] = value.reshape(())
        graph.nodes.append(Node("Expand", [scalar, inputs[0]], outputs[:1], {},
                                name))
        return
    dims = graph.initializers[inputs[0]]
    if dims.ndim != 1 or dims.dtype.kind not in "iu" or (dims < 0).any():
        raise OnnxFormatError(f"{label}: the shape of a ConstantOfShape must be a 1-D tensor of "
                              f"non-negative integers, got {dims.dtype}{list(dims.shape)}")
    shape = tuple(int(d) for d in dims)
    count, limit = math.prod(shape), load_limit("CONSTANT_ELEMENTS")
    if count > limit:
        raise OnnxFormatError(f"{label}: ConstantOfShape{list(shape)} would build {count} "
                              f"elements, more than the limit of {limit}; raise "
                              "ONEMODEL_MAX_CONSTANT_ELEMENTS if this model is genuine")
    graph.initializers[outputs[0]] = np.full(shape, value.reshape(-1)[0], value.dtype)


def _convert_node(node, op, name, label, inputs, outputs, attrs, opset, graph: Graph,
                  fresh) -> None:
    if op in ("Constant", "ConstantOfShape") and (not outputs or not outputs[0]):
        raise OnnxFormatError(f"{label}: a {op} needs its output")
    if op == "Constant":
        graph.initializers[outputs[0]] = _constant(node, label, attrs)
        return
    if op == "ConstantOfShape":
        _constant_of_shape(node, name, label, inputs, outputs, attrs, graph, fresh)
        return
    view = _ImportNode(op, inputs, outputs, attrs, opset, label, graph, fresh)
    seen = set()
    while view.op not in seen:  # an adapter may rename the op (a legacy op to its successor)
        seen.add(view.op)
        for adapt in adapters_for(view.op, opset):
            adapt(view)
            if view.replaced:
                return
    op, inputs, attrs = view.op, view.inputs, view.attrs
    if op not in OPS or OPS[op].domain:
        raise UnsupportedOpError(f"{label}: op {op!r} is not in OneModel's op set")
    known = OPS[op].attrs
    for k in list(attrs):
        if k in _LEGACY and k not in known:
            del attrs[k]
    extra = [k for k in attrs if k not in known]
    if extra:
        raise UnsupportedOpError(f"{label}: attribute {extra[0]!r} of {op} is not supported")
    for k, v in attrs.items():
        if isinstance(v, list):
            attrs[k] = tuple(v)
    while inputs and inputs[-1] == "":
        inputs.pop()
    graph.nodes.append(Node(op, inputs, view.outputs, attrs, name))


class _ImportNode(ImportNode):
    """What the op set's import adapters (``onemodel.tensors.ops.adapters``) see of a node."""

    def __init__(self, op, inputs, outputs, attrs, opset, label, graph: Graph, fresh):
        self.op, self.inputs, self.outputs, self.attrs = op, list(inputs), list(outputs), attrs
        self.opset, self.label, self.replaced = opset, label, False
        self._graph, self._fresh = graph, fresh

    def const(self, values, dtype=np.int64) -> str:
        return _const(self._graph, self._fresh, values, dtype)

    def emit(self, op, inputs, attrs=None, outputs=1, names=None) -> list[str]:
        names = list(names) if names else [self._fresh(f"{op}_out") for _ in range(outputs)]
        self._graph.nodes.append(Node(op, list(inputs), names, dict(attrs or {}),
                                      self._fresh(op)))
        return names

    def dtype(self, code):
        return from_onnx(code, f"{self.label} attribute")

    def error(self, message: str) -> OneModelError:
        return OnnxFormatError(f"{self.label}: {message}")
