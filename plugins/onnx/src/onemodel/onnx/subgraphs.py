"""ONNX control flow and non-tensor values on import: subgraph attributes (If branches, Loop,
Scan and SequenceMap bodies), sequence and optional types.

A subgraph is converted recursively into a runtime ``Graph``. The values it reads from an
enclosing graph (ONNX lets a subgraph name any value in scope) become explicit: they are
appended to the node's inputs and to each subgraph's inputs, in one order, and the node's
``num_captures`` attribute counts them (see ``onemodel.runtime.controlflow``). A subgraph
nested deeper passes its own captures up the same way.
"""

from __future__ import annotations

from collections.abc import Callable

from onemodel.runtime import Graph, ValueInfo
from onemodel.runtime.dims import parse_dim
from onemodel.tensors import DimExpr, DType, OneModelError, TensorSpec
from onemodel.tensors.ops.sequence import OptionalSpec, SequenceSpec

from .dtypes import from_onnx

# ops whose attributes hold subgraphs, and the attributes
GRAPH_ATTRS = {"If": ("then_branch", "else_branch"), "Loop": ("body",), "Scan": ("body",),
               "SequenceMap": ("body",)}
MAX_DEPTH = 32


class SubgraphError(OneModelError):
    """A subgraph attribute cannot be converted; the message names the node."""


def value_info(v, unknown: list, text: Callable = lambda x, what: x, *,
               subgraph: bool = False) -> ValueInfo:
    """A graph input or output of any ONNX type: tensor, sequence of tensors, optional tensor or
    sequence. In a subgraph a value may lack its type: it is declared as a 0-d F32 tensor, a
    placeholder only, since a subgraph is planned from the values it is given."""
    name = text(v.name, "a graph input or output name")
    t = v.type
    which = t.WhichOneof("value")
    if which is None and subgraph:
        return ValueInfo(name, DType.F32, ())
    if which is None:
        which = "tensor_type"  # no type at all: the element type check below names it
    if which == "tensor_type":
        if subgraph and not t.tensor_type.elem_type:  # typeless: a placeholder, as above
            return ValueInfo(name, DType.F32, ())
        dtype, dims = _tensor(t.tensor_type, name, unknown, text)
        return ValueInfo(name, dtype, dims)
    if which == "sequence_type":
        dtype, dims = _elem(t.sequence_type.elem_type, name, unknown, text)
        return ValueInfo(name, dtype, dims, "sequence")
    if which == "optional_type":
        inner = t.optional_type.elem_type
        kind = inner.WhichOneof("value")
        if kind == "tensor_type":
            dtype, dims = _tensor(inner.tensor_type, name, unknown, text)
            return ValueInfo(name, dtype, dims, "optional")
        if kind == "sequence_type":
            dtype, dims = _elem(inner.sequence_type.elem_type, name, unknown, text)
            return ValueInfo(name, dtype, dims, "optional_sequence")
        raise SubgraphError(f"value {name!r} is an optional of {kind}, which OneModel does "
                            "not support (optional tensors and sequences only)")
    raise SubgraphError(f"value {name!r} is not a tensor, sequence or optional ({which}); "
                        "OneModel does not support it")


def _elem(elem, name, unknown, text):
    kind = elem.WhichOneof("value")
    if kind is None:  # a sequence whose element type is left open (subgraph values)
        return DType.F32, ()
    if kind != "tensor_type":
        raise SubgraphError(f"value {name!r} is a sequence of {kind}, which OneModel does "
                            "not support (sequences of tensors only)")
    return _tensor(elem.tensor_type, name, unknown, text)


def _tensor(t, name, unknown, text):
    dtype = from_onnx(t.elem_type, f"value {name!r}")
    dims = []
    if t.HasField("shape"):
        for d in t.shape.dim:
            if d.HasField("dim_value") and d.dim_value >= 0:
                dims.append(int(d.dim_value))
            elif d.HasField("dim_param") and d.dim_param:
                s = text(d.dim_param, f"a dimension name of {name!r}")
                try:
                    dims.append(parse_dim(s))
                except OneModelError:
                    dims.append(DimExpr.symbol(s.replace(" ", "_")))
            else:
                unknown[0] += 1
                dims.append(DimExpr.symbol(f"unk__{unknown[0]}"))
    return dtype, tuple(dims)


def type_spec(t, what: str):
    """An ONNX TypeProto as a spec (the ``type`` attribute of ``Optional``)."""
    kind = t.WhichOneof("value")
    if kind == "tensor_type":
        dtype = from_onnx(t.tensor_type.elem_type, what)
        dims = tuple(int(d.dim_value) if d.HasField("dim_value") else DimExpr.symbol(
            f"{d.dim_param or 'unk'}") for d in t.tensor_type.shape.dim)
        return TensorSpec(dims, dtype)
    if kind == "sequence_type":
        inner = type_spec(t.sequence_type.elem_type, what)
        return SequenceSpec(inner.dtype, None)
    if kind == "optional_type":
        return OptionalSpec(type_spec(t.optional_type.elem_type, what), None)
    raise SubgraphError(f"{what}: type {kind} is not supported")


def convert_attrs(op: str, label: str, inputs: list[str], attrs: dict, opset: int, fresh,
                  convert_node: Callable, to_array: Callable, depth: int = 0):
    """The node's inputs and attributes with ONNX subgraphs converted and their outer-scope
    reads made explicit; TypeProto and dtype attributes as the op set takes them."""
    if op == "Optional" and "type" in attrs:
        attrs["type"] = type_spec(attrs["type"], f"{label} 'type'")
    if op == "SequenceEmpty" and "dtype" in attrs:
        attrs["dtype"] = from_onnx(attrs["dtype"], f"{label} 'dtype'")
    names = GRAPH_ATTRS.get(op, ())
    protos = {k: v for k, v in attrs.items() if hasattr(v, "node") and hasattr(v, "output")}
    if not protos:
        return inputs, attrs
    unexpected = set(protos) - set(names)
    if unexpected:
        raise SubgraphError(f"{label}: attribute {sorted(unexpected)[0]!r} holds a graph, "
                            f"which {op} does not take")
    if op == "Scan" and opset < 9:  # Scan-8: sequence_lens first, a batch axis on every value
        if inputs and inputs[0]:
            raise SubgraphError(f"{label}: Scan-8 with sequence_lens (sequences of different "
                                "lengths in one batch) is not supported; re-export the model "
                                "at opset 9 or later")
        inputs = list(inputs[1:])
        if "directions" in attrs:
            attrs["scan_input_directions"] = attrs.pop("directions")
        attrs["batched"] = 1
    if depth > MAX_DEPTH:
        raise SubgraphError(f"{label}: subgraphs are nested more than {MAX_DEPTH} levels deep")
    graphs, captures = {}, []
    for key in names:
        if key not in protos:
            continue
        g, free = convert_graph(protos[key], opset, fresh, convert_node, to_array,
                                f"{label} {key}", depth + 1)
        graphs[key] = g
        captures.extend(f for f in free if f not in captures)
    for g in graphs.values():  # every subgraph takes every capture, in one order
        have = {v.name for v in g.inputs}
        g.inputs.extend(ValueInfo(c, DType.F32, ()) for c in captures if c not in have)
        order = {c: i for i, c in enumerate(captures)}
        own = [v for v in g.inputs if v.name not in order]
        g.inputs = own + sorted((v for v in g.inputs if v.name in order),
                                key=lambda v: order[v.name])
    attrs.update(graphs)
    attrs["num_captures"] = len(captures)
    return list(inputs) + captures, attrs


def convert_graph(proto, opset: int, fresh, convert_node: Callable, to_array: Callable,
                  label: str, depth: int = 1) -> tuple[Graph, list[str]]:
    """A GraphProto as a runtime Graph, and the names it reads from enclosing graphs (in order
    of first use), which are appended to its inputs."""
    from onemodel.tensors.fileio import load_limit

    limit = load_limit("NODES")
    if len(proto.node) > limit:
        raise SubgraphError(f"{label}: the subgraph has {len(proto.node)} nodes, more than the "
                            f"limit of {limit}; raise ONEMODEL_MAX_NODES if this model is genuine")
    unknown = [0]
    g = Graph([value_info(v, unknown, subgraph=True) for v in proto.input],
              [value_info(v, unknown, subgraph=True) for v in proto.output], [], {}, {},
              proto.name or fresh("subgraph"))
    for t in proto.initializer:
        g.initializers[t.name] = to_array(t, f"{label}: initializer {t.name!r}")
    for node in proto.node:
        convert_node(node, opset, g, fresh, depth)
    defined = {v.name for v in g.inputs} | set(g.initializers)
    free: list[str] = []
    for n in g.nodes:
        for i in n.inputs:
            if i and i not in defined and i not in free:
                free.append(i)
        defined.update(o for o in n.outputs if o)
    for v in g.outputs:
        if v.name not in defined and v.name not in free:
            free.append(v.name)
    g.inputs.extend(ValueInfo(name, DType.F32, ()) for name in free)
    return g, free
