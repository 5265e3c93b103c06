"""Graphs with subgraphs (Loop, If) and non-tensor values in the .onemodel format: exact round
trips that run to the same results, and clear errors for corrupt or absurdly nested subgraphs."""

from __future__ import annotations

import json
import struct
import zlib

import numpy as np
import pytest

from onemodel.native.format import NativeFormatError
from onemodel.runtime import Graph, Node, Session, ValueInfo, load, save
from onemodel.tensors import DimExpr, DType
from onemodel.tensors.ops.sequence import OptionalSpec, TensorSpec

N = DimExpr.symbol("n")


def _loop_graph() -> Graph:
    """acc <- acc + w * i for i < M, with w read from the outer graph; the If inside the body
    picks a scale by the parity of i from a subgraph initializer."""
    then_g = Graph([ValueInfo("v", DType.F32, (N,))], [ValueInfo("t", DType.F32, (N,))],
                   [Node("Mul", ["v", "k"], ["t"], name="then_mul")],
                   {"k": np.array(2.0, np.float32)}, name="then")
    else_g = Graph([ValueInfo("v", DType.F32, (N,))], [ValueInfo("v", DType.F32, (N,))], [],
                   name="else")
    body = Graph(
        [ValueInfo("i", DType.I64, ()), ValueInfo("c", DType.BOOL, ()),
         ValueInfo("acc", DType.F32, (N,)), ValueInfo("w", DType.F32, (N,))],
        [ValueInfo("c", DType.BOOL, ()), ValueInfo("acc2", DType.F32, (N,)),
         ValueInfo("acc2", DType.F32, (N,))],
        [Node("Mod", ["i", "two"], ["r"], name="mod"),
         Node("Equal", ["r", "zero"], ["even"], name="eq"),
         Node("Cast", ["i"], ["fi"], {"to": DType.F32}, "cast"),
         Node("Mul", ["w", "fi"], ["wi"], name="mul"),
         Node("If", ["even", "wi"], ["step"], {"then_branch": then_g, "else_branch": else_g,
                                              "num_captures": 1}, "if"),
         Node("Add", ["acc", "step"], ["acc2"], name="add")],
        {"two": np.array(2, np.int64), "zero": np.array(0, np.int64)}, name="body")
    return Graph(
        [ValueInfo("M", DType.I64, ()), ValueInfo("x", DType.F32, (N,)),
         ValueInfo("w", DType.F32, (N,))],
        [ValueInfo("out", DType.F32, (N,)), ValueInfo("trace", DType.F32, (DimExpr.symbol("t"), N))],
        [Node("Loop", ["M", "", "x", "w"], ["out", "trace"], {"body": body, "num_captures": 1},
              "loop")], name="outer")


def _expected(m, x, w):
    acc, trace = x.copy(), []
    for i in range(m):
        acc = acc + w * i * (2.0 if i % 2 == 0 else 1.0)
        trace.append(acc)
    return acc, np.array(trace, np.float32)


def _same(a: Graph, b: Graph):
    assert [(v.name, v.dtype, v.shape, v.kind) for v in a.inputs] == [
        (v.name, v.dtype, v.shape, v.kind) for v in b.inputs]
    assert [(v.name, v.dtype, v.shape, v.kind) for v in a.outputs] == [
        (v.name, v.dtype, v.shape, v.kind) for v in b.outputs]
    assert [(n.op, n.name, n.inputs, n.outputs) for n in a.nodes] == [
        (n.op, n.name, n.inputs, n.outputs) for n in b.nodes]
    for na, nb in zip(a.nodes, b.nodes):
        assert na.attrs.keys() == nb.attrs.keys()
        for k, v in na.attrs.items():
            if isinstance(v, Graph):
                _same(v, nb.attrs[k])
            else:
                assert v == nb.attrs[k]
    assert list(a.initializers) == list(b.initializers)
    for k in a.initializers:
        assert np.array_equal(a.initializers[k], b.initializers[k])


def test_a_loop_with_a_nested_if_round_trips_and_runs_the_same(tmp_path):
    g = _loop_graph()
    path = tmp_path / "loop.onemodel"
    save(g, path)
    loaded = load(path)
    _same(g, loaded)
    session = Session(loaded)
    for m in (0, 1, 4):
        for n in (2, 5):
            x = np.linspace(-1, 1, n).astype(np.float32)
            w = np.arange(n, dtype=np.float32)
            got = session.run({"M": np.array(m), "x": x, "w": w}, return_numpy=True)
            acc, trace = _expected(m, x, w)
            np.testing.assert_allclose(got["out"], acc, rtol=1e-6)
            if m:
                np.testing.assert_allclose(got["trace"], trace, rtol=1e-6)
            else:
                assert got["trace"].shape == (0, n)


def test_sequence_and_optional_values_round_trip(tmp_path):
    g = Graph([ValueInfo("s", DType.F32, (), "sequence"),
               ValueInfo("o", DType.F32, (3,), "optional")],
              [ValueInfo("n", DType.I64, ()), ValueInfo("has", DType.BOOL, ()),
               ValueInfo("e", DType.F32, (3,), "optional")],
              [Node("SequenceLength", ["s"], ["n"], name="len"),
               Node("OptionalHasElement", ["o"], ["has"], name="has"),
               Node("Optional", [], ["e"], {"type": OptionalSpec(TensorSpec((3,), DType.F32))},
                    "empty")])
    path = tmp_path / "values.onemodel"
    save(g, path)
    loaded = load(path)
    _same(g, loaded)
    out = Session(loaded).run({"s": [np.zeros(2, np.float32)] * 3, "o": None},
                              return_numpy=True)
    assert int(out["n"]) == 3 and not bool(out["has"]) and out["e"] is None


def _rewrite_header(path, edit):
    raw = path.read_bytes()
    fixed = struct.Struct("<8sIIQQII")
    magic, version, flags, hlen, dlen, _, dcrc = fixed.unpack(raw[:fixed.size])
    header = json.loads(raw[fixed.size:fixed.size + hlen])
    edit(header)
    text = json.dumps(header).encode()
    text += b" " * (-(fixed.size + len(text)) % 64)
    data = raw[fixed.size + hlen:]
    path.write_bytes(fixed.pack(magic, version, flags, len(text), dlen, zlib.crc32(text), dcrc)
                     + text + data)


def _nest(header, depth):
    node = header["nodes"][0]
    inner = node["attrs"]["body"]["graph"]
    for _ in range(depth):
        inner = {"name": "g", "metadata": {}, "inputs": [], "outputs": [], "initializers": [],
                 "nodes": [{"op": "If", "name": "x", "inputs": [], "outputs": [],
                            "attrs": {"then_branch": {"graph": inner}}}]}
    node["attrs"]["body"] = {"graph": inner}


@pytest.mark.parametrize("edit, message", [
    (lambda h: h["nodes"][0]["attrs"].update(body={"graph": []}), "not a table"),
    (lambda h: h["nodes"][0]["attrs"]["body"]["graph"]["inputs"][0].update(kind="tuple"),
     "unknown value kind"),
    (lambda h: _nest(h, 40), "nested more than"),
    (lambda h: h["nodes"][0]["attrs"]["body"]["graph"]["initializers"][0].update(offset=1 << 40),
     "truncated"),
])
def test_corrupt_subgraphs_are_native_format_errors(tmp_path, edit, message):
    path = tmp_path / "loop.onemodel"
    save(_loop_graph(), path)
    _rewrite_header(path, edit)
    with pytest.raises(NativeFormatError, match=message):
        load(path)
