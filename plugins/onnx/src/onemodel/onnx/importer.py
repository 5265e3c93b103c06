"""ONNX ModelProto -> Graph.

Models from opset 7 on are brought to the op set's semantics (ONNX opset 18 forms) by adapters
written per op: attributes that later opsets turned into inputs (Reduce* and Squeeze axes, Split
sizes, Slice bounds, Clip bounds, Pad pads), Softmax's pre-13 flattening, legacy attributes. IR < 4
models that list initializers as graph inputs are handled as ONNX Runtime does: an input with an
initializer is a constant. ``dim_param`` axes become symbols. External data files are read from
beside the model.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from onemodel.runtime import Graph, Node, ValueInfo
from onemodel.runtime.dims import parse_dim
from onemodel.runtime.guards import METADATA_KEY, guards_from_json
from onemodel.tensors import DimExpr, OneModelError
from onemodel.tensors.ops import OPS

from .dtypes import from_onnx


class UnsupportedOpError(OneModelError):
    """The model uses an op the runtime does not have."""


# attributes of older opsets that carry no meaning any more
_LEGACY = {"consumed_inputs", "is_test", "spatial", "saturate"}
_REDUCE = {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin"}


def load(path: str | os.PathLike) -> Graph:
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=True)
    except Exception as exc:
        raise OneModelError(f"{path}: not a readable ONNX model ({type(exc).__name__}: {exc})") \
            from None
    return from_model(model, Path(path).stem)


def from_model(model, name: str = "graph") -> Graph:
    from onnx import numpy_helper

    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    g = model.graph
    inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
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
    graph = Graph(inputs, outputs, [], {}, {p.key: p.value for p in model.metadata_props},
                  g.name or name)
    graph.metadata.setdefault("producer", model.producer_name)
    for k, arr in inits.items():
        graph.initializers[k] = _supported(arr, k)
    for node in g.node:
        _convert(node, opset, graph, fresh)
    graph.guards = guards_from_json(graph.metadata.pop(METADATA_KEY, "[]"))
    graph.validate(allow_unknown=True)
    return graph


def _supported(arr: np.ndarray, name: str) -> np.ndarray:
    from onemodel.tensors import DType

    DType.from_numpy(arr.dtype)
    return arr


def _value_info(v, unknown) -> ValueInfo:
    t = v.type.tensor_type
    dtype = from_onnx(t.elem_type, f"value {v.name!r}")
    dims = []
    for d in t.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param") and d.dim_param:
            try:
                dims.append(parse_dim(d.dim_param))
            except OneModelError:
                dims.append(DimExpr.symbol(d.dim_param.replace(" ", "_")))
        else:
            unknown[0] += 1
            dims.append(DimExpr.symbol(f"unk__{unknown[0]}"))
    return ValueInfo(v.name, dtype, tuple(dims))


def _attrs(node) -> dict:
    from onnx import helper

    out = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        if isinstance(v, bytes):
            v = v.decode()
        elif isinstance(v, list):
            v = tuple(x.decode() if isinstance(x, bytes) else x for x in v)
        out[a.name] = v
    return out


def _const(graph: Graph, fresh, values, dtype=np.int64) -> str:
    name = fresh("const")
    graph.initializers[name] = np.asarray(values, dtype=dtype)
    return name


def _convert(node, opset: int, graph: Graph, fresh) -> None:
    from onnx import numpy_helper

    op, domain = node.op_type, node.domain or "ai.onnx"
    attrs = _attrs(node)
    inputs, outputs = list(node.input), list(node.output)
    label = f"node {node.name or '?'} ({op}, domain {domain}, opset {opset})"
    if domain not in ("ai.onnx", ""):
        raise UnsupportedOpError(f"{label}: domain {domain!r} is not supported")
    if op == "Constant":
        (key, value), = attrs.items()
        if key == "value":
            arr = numpy_helper.to_array(node.attribute[0].t)
        elif key in ("value_float", "value_floats"):
            arr = np.asarray(value, np.float32)
        elif key in ("value_int", "value_ints"):
            arr = np.asarray(value, np.int64)
        else:
            raise UnsupportedOpError(f"{label}: Constant with {key} is not supported")
        graph.initializers[outputs[0]] = _supported(arr, outputs[0])
        return
    if op == "ConstantOfShape":
        # folded on import when its shape is a constant (weights of the model-zoo files)
        if inputs[0] not in graph.initializers:
            raise UnsupportedOpError(f"{label}: ConstantOfShape of a shape known only at run "
                                     "time is not supported")
        value = (numpy_helper.to_array(node.attribute[0].t) if node.attribute
                 else np.zeros(1, np.float32))
        shape = tuple(int(d) for d in graph.initializers[inputs[0]].reshape(-1))
        graph.initializers[outputs[0]] = np.full(shape, value.reshape(-1)[0], value.dtype)
        return
    for k in list(attrs):
        if k in _LEGACY:
            del attrs[k]
    # attribute forms of older opsets -> the input forms of opset 18
    if (op in _REDUCE and "axes" in attrs) or (op in ("Squeeze", "Unsqueeze") and "axes" in attrs):
        inputs = [inputs[0], _const(graph, fresh, attrs.pop("axes"))]
    elif op == "Split" and "split" in attrs:
        inputs = [inputs[0], _const(graph, fresh, attrs.pop("split"))]
    elif op == "Split" and len(inputs) < 2 and "num_outputs" not in attrs:
        attrs["num_outputs"] = len(outputs)
    elif op == "Slice" and "starts" in attrs:
        names = [_const(graph, fresh, attrs.pop("starts")), _const(graph, fresh, attrs.pop("ends"))]
        if "axes" in attrs:
            names.append(_const(graph, fresh, attrs.pop("axes")))
        inputs = [inputs[0], *names]
    elif op == "Clip" and ("min" in attrs or "max" in attrs):
        lo = attrs.pop("min", None)
        hi = attrs.pop("max", None)
        inputs = [inputs[0], "" if lo is None else _const(graph, fresh, lo, np.float32),
                  "" if hi is None else _const(graph, fresh, hi, np.float32)]
    elif op == "Pad" and "pads" in attrs:
        value = attrs.pop("value", 0.0)
        inputs = [inputs[0], _const(graph, fresh, attrs.pop("pads")),
                  _const(graph, fresh, value, np.float32)]
    elif op == "Dropout" and opset < 12:
        attrs.pop("ratio", None)
    elif op in ("Softmax", "LogSoftmax") and opset < 13:
        _old_softmax(op, inputs[0], outputs[0], attrs.get("axis", 1), graph, fresh, node.name)
        return
    elif op == "Upsample" or op == "Resize":
        raise UnsupportedOpError(f"{label}: op {op!r} is not in OneModel's op set")
    if op not in OPS or OPS[op].domain:
        raise UnsupportedOpError(f"{label}: op {op!r} is not in OneModel's op set")
    known = OPS[op].attrs
    extra = [k for k in attrs if k not in known]
    if extra:
        raise UnsupportedOpError(f"{label}: attribute {extra[0]!r} of {op} is not supported")
    if op == "Cast":
        attrs["to"] = from_onnx(attrs["to"], f"{label} 'to'")
    for k, v in attrs.items():
        if isinstance(v, list):
            attrs[k] = tuple(v)
    while inputs and inputs[-1] == "":
        inputs.pop()
    graph.nodes.append(Node(op, inputs, outputs, attrs, node.name or fresh(op)))


def _old_softmax(op, x, y, axis, graph, fresh, name):
    """Softmax before opset 13: over the input flattened to 2-D at ``axis``."""
    shape = fresh("shape")
    flat = fresh("flat")
    soft = fresh("soft")
    graph.nodes.append(Node("Shape", [x], [shape], {}, fresh("Shape")))
    graph.nodes.append(Node("Flatten", [x], [flat], {"axis": axis}, fresh("Flatten")))
    graph.nodes.append(Node(op, [flat], [soft], {"axis": -1}, name or fresh(op)))
    graph.nodes.append(Node("Reshape", [soft, shape], [y], {}, fresh("Reshape")))
