"""Graph -> ONNX ModelProto.

The op set follows ONNX semantics, so nodes map one to one. Symbolic dims become ``dim_param``
under the user's axis names; shape arithmetic recorded by the tracer (Shape, Gather, Concat...)
is exported as nodes, so no example size is frozen into a Reshape target.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from onemodel.runtime import Graph
from onemodel.runtime.guards import METADATA_KEY, guards_to_json
from onemodel.tensors import DimExpr, DType, OneModelError
from onemodel.tensors.fileio import atomic_write
from onemodel.tensors.ops import OPS

from .dtypes import TO_ONNX, min_opset
from .integrity import KEY, initializers_crc

DEFAULT_OPSET = 18  # files are written at this opset, or higher where an op's form needs it
IR_VERSION = 8


def required_opset(graph: Graph) -> int:
    """The lowest opset whose forms hold every node and every element type of the graph."""
    dtypes = [v.dtype for v in graph.inputs + graph.outputs]
    dtypes += [DType.from_numpy(a.dtype) for a in graph.initializers.values()]
    need = max(DEFAULT_OPSET, min_opset(dtypes))
    for n in graph.nodes:
        op = OPS.get(n.op)
        if op is not None:
            need = max(need, op.export_opset(n.attrs))
    return need


def to_model(graph: Graph, opset: int | None = None):
    import onnx
    from onnx import helper, numpy_helper

    graph.validate(allow_unknown=True)
    need = required_opset(graph)
    target = need if opset is None else int(opset)
    _refuse_control_flow(graph)
    for n in graph.nodes:
        if OPS[n.op].domain:
            raise OneModelError(f"node {n.name} ({n.op}) is a OneModel-internal op with no ONNX "
                                "form; export the graph before optimization (TracedModel.graph)")
    nodes = [helper.make_node(n.op, list(n.inputs), list(n.outputs), name=n.name or None,
                              **{k: _attr(v) for k, v in n.attrs.items() if v is not None})
             for n in graph.nodes]
    # ascontiguousarray turns a 0-d array into 1-d: each initializer keeps its shape
    inits = [numpy_helper.from_array(np.ascontiguousarray(a).reshape(a.shape), name)
             for name, a in graph.initializers.items()]
    g = helper.make_graph(nodes, graph.name or "graph",
                          [_value_info(v.name, v.dtype, v.shape) for v in graph.inputs],
                          [_value_info(v.name, v.dtype, v.shape) for v in graph.outputs], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", need)],
                              producer_name=graph.metadata.get("producer", "onemodel"),
                              producer_version=graph.metadata.get("producer_version", "0.1.0"))
    model.ir_version = IR_VERSION
    for k, v in graph.metadata.items():
        if k not in ("producer", "producer_version", KEY):
            entry = model.metadata_props.add()
            entry.key, entry.value = str(k), str(v)
    if target != need:
        if target < need:
            from onnx import version_converter

            try:
                model = version_converter.convert_version(model, target)
            except Exception as exc:
                raise OneModelError(f"cannot export at opset {target}: this graph needs opset "
                                    f"{need} ({exc})") from None
        else:
            model.opset_import[0].version = target
    # the IR version that opset needs (float8 and int4 files need IR 9 and 10), at least 8
    model.ir_version = max(IR_VERSION, helper.find_min_ir_version_for(list(model.opset_import)))
    entry = model.metadata_props.add()  # verified by the importer: ONNX has no checksum
    entry.key, entry.value = KEY, initializers_crc(
        (t.name, numpy_helper.to_array(t)) for t in model.graph.initializer)
    if graph.guards:  # ONNX cannot enforce them; they travel as metadata for readers
        entry = model.metadata_props.add()
        entry.key, entry.value = METADATA_KEY, guards_to_json(graph.guards)
    onnx.checker.check_model(model)
    return model


def _refuse_control_flow(graph: Graph) -> None:
    """Subgraphs and non-tensor values have no ONNX export yet: say so instead of writing a
    file that would not load."""
    for v in graph.inputs + graph.outputs:
        if v.kind != "tensor":
            raise OneModelError(f"ONNX export of {v.kind} values ({v.name!r}) is not supported "
                                "yet; save the graph in the native format (.onemodel) instead")
    for n in graph.nodes:
        if any(isinstance(v, Graph) for v in n.attrs.values()):
            raise OneModelError(f"ONNX export of control flow (node {n.name or '?'}, {n.op} with "
                                "a subgraph) is not supported yet; save the graph in the native "
                                "format (.onemodel) instead")


def save(graph: Graph, path: str | os.PathLike, opset: int | None = None) -> None:
    model = to_model(graph, opset)
    atomic_write(path, [model.SerializeToString()])


def _value_info(name: str, dtype: DType, shape):
    from onnx import helper

    dims = [str(d) if isinstance(d, DimExpr) else int(d) for d in shape]
    return helper.make_tensor_value_info(name, TO_ONNX[dtype], dims)


def _attr(v: Any):
    if isinstance(v, DType):
        return TO_ONNX[v]
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, tuple):
        return list(v)
    return v
