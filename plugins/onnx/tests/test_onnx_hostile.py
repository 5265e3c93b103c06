"""The ONNX importer under hostile files: every malformed model is a OneModelError naming what is
wrong, nothing large is allocated before a size is checked, and the initializer checksum that
OneModel's export records catches flipped weight bytes."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
import tracemalloc

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper  # noqa: E402

from onemodel.onnx.export import save as save_onnx  # noqa: E402
from onemodel.onnx.importer import from_model  # noqa: E402
from onemodel.onnx.importer import load as load_onnx  # noqa: E402
from onemodel.onnx.integrity import KEY  # noqa: E402
from onemodel.runtime import GraphBuilder, Session  # noqa: E402
from onemodel.tensors import DType, OneModelError  # noqa: E402


def _model(nodes, inits=(), opset=18, inputs=None):
    graph = helper.make_graph(
        nodes, "g", inputs if inputs is not None else
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _small_graph():
    b = GraphBuilder("small")
    x = b.input("x", DType.F32, ("batch", 4))
    w = b.initializer("w", np.arange(12, dtype=np.float32).reshape(4, 3))
    b.output(b.op("Relu", b.op("MatMul", x, w)), "y")
    return b.build()


@pytest.mark.parametrize("data", [b"", bytes(27), b"\x12\x00", b":\x02\x0a\x00"],
                         ids=["empty", "27 zero bytes", "empty producer", "graph without outputs"])
def test_a_file_without_a_graph_or_outputs_is_refused(tmp_path, data):
    path = tmp_path / "m.onnx"
    path.write_bytes(data)
    with pytest.raises(OneModelError, match="m.onnx: .*(no graph|no outputs|not a readable)"):
        load_onnx(path)


def _raw(name, dtype, dims, raw):
    t = TensorProto(name=name, data_type=dtype, dims=dims)
    t.raw_data = raw
    return t


def _const_node(**attrs):
    n = helper.make_node("Constant", [], ["y"])
    for k, v in attrs.items():
        n.attribute.append(helper.make_attribute(k, v))
    return n


_STRINGS = helper.make_tensor("w", TensorProto.STRING, [1], [b"\xff\xfe"])
_BAD = {
    "short raw data": (_model([helper.make_node("Add", ["x", "w"], ["y"])],
                              [_raw("w", TensorProto.FLOAT, [3], b"\0\0")]),
                       "'w' holds 2 bytes, its shape \\[3\\] and dtype F32 need 12"),
    "unknown data type": (_model([helper.make_node("Add", ["x", "w"], ["y"])],
                                 [_raw("w", 99, [1], b"\0" * 4)]), "element type 99"),
    "undecodable strings": (_model([helper.make_node("Add", ["x", "w"], ["y"])], [_STRINGS]),
                            "element type 8"),
    "string Constant": (_model([_const_node(value=_STRINGS)]), "element type 8"),
    "Constant without a value": (_model([_const_node()]), "exactly one value attribute, it has 0"),
    "Constant with two values": (_model([_const_node(value_float=1.0, value_int=2)]),
                                 "exactly one value attribute, it has 2"),
    "ConstantOfShape without its input": (_model([helper.make_node("ConstantOfShape", [], ["y"])]),
                                          "ConstantOfShape needs 1 input"),
    "Squeeze (opset 11) without input": (_model([helper.make_node("Squeeze", [], ["y"], axes=[0])],
                                                opset=11), "Squeeze needs 1 input"),
    "Squeeze without input": (_model([helper.make_node("Squeeze", [], ["y"])]),
                              "missing required input data of Squeeze"),
    "Softmax (opset 11) without input": (_model([helper.make_node("Softmax", [], ["y"])],
                                                opset=11), "Softmax needs 1 input"),
    "Slice without ends": (_model([helper.make_node("Slice", ["x"], ["y"], starts=[0])], opset=9),
                           "needs 'ends'"),
    "Slice with an empty ends input": (_model([helper.make_node("Slice", ["x", "s", "", "s"],
                                                                ["y"])],
                                              [helper.make_tensor("s", TensorProto.INT64, [1],
                                                                  [0])]),
                                       "missing required input ends of Slice"),
    "Cast without to": (_model([helper.make_node("Cast", ["x"], ["y"])]),
                        "Cast needs its 'to' attribute"),
    "Gemm without A": (_model([helper.make_node("Gemm", ["", "x", "x"], ["y"])]),
                       "missing required input A of Gemm"),
    "Conv with zero strides (found by the fuzz suite)": (
        _model([helper.make_node("Conv", ["x4", "k"], ["y"], strides=[0, 0])],
               [helper.make_tensor("k", TensorProto.FLOAT, [1, 1, 1, 1], [1.0])],
               inputs=[helper.make_tensor_value_info("x4", TensorProto.FLOAT, [1, 1, 3, 3])]),
        "Conv: .*(division|modulo) by zero"),
    "negative dims": (_model([helper.make_node("Add", ["x", "w"], ["y"])],
                             [_raw("w", TensorProto.FLOAT, [-1], b"")]), "negative dimension"),
    "ConstantOfShape with a negative size": (
        _model([helper.make_node("ConstantOfShape", ["s"], ["y"])],
               [helper.make_tensor("s", TensorProto.INT64, [2], [-3, 2])]),
        "non-negative integers"),
}


@pytest.mark.parametrize("name", list(_BAD))
def test_malformed_models_are_onemodel_errors_that_say_what(name):
    model, message = _BAD[name]
    with pytest.raises(OneModelError, match=message):
        from_model(model)


@pytest.mark.parametrize("field", [b"NNNN", b"DDDD", b"XXXX"])
def test_text_that_is_not_utf8_is_refused(tmp_path, field):
    # proto2 hands back bytes for invalid UTF-8; they must not become names or symbols
    model = _model([helper.make_node("Relu", ["x"], ["y"], name="NNNN")],
                   inputs=[helper.make_tensor_value_info("x", TensorProto.FLOAT, ["DDDD", 3])])
    model.metadata_props.add(key="XXXX", value="v")
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString().replace(field, b"\xff\xfe\xfd\xfc"))
    with pytest.raises(OneModelError, match="not valid UTF-8"):
        load_onnx(path)


@pytest.mark.parametrize("text,message", [
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('[{"condition": "' + "9" * 350 + ' * 1.5 > 0", "axis": "b", "location": "x"}]',
     "cannot be read \\(OverflowError"),
    ("[Infinity]", "Infinity"),
])
def test_hostile_guards_in_metadata_are_onemodel_errors(text, message):
    model = _model([helper.make_node("Relu", ["x"], ["y"])])
    model.metadata_props.add(key="onemodel.guards", value=text)
    with pytest.raises(OneModelError, match=message):
        from_model(model)


def test_constant_of_shape_is_bounded_before_it_allocates(tmp_path):
    model = _model([helper.make_node("ConstantOfShape", ["s"], ["y"])],
                   [helper.make_tensor("s", TensorProto.INT64, [2], [40000, 40000])])
    path = tmp_path / "cos.onnx"
    path.write_bytes(model.SerializeToString())
    assert path.stat().st_size < 100
    tracemalloc.start()
    try:
        with pytest.raises(OneModelError, match="40000, 40000.*ONEMODEL_MAX_CONSTANT_ELEMENTS"):
            load_onnx(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 50 * 2**20


def test_constant_of_shape_limit_is_configurable(monkeypatch):
    model = _model([helper.make_node("ConstantOfShape", ["s"], ["y"])],
                   [helper.make_tensor("s", TensorProto.INT64, [2], [30, 40])])
    model.graph.input.pop()
    np.testing.assert_array_equal(from_model(model).initializers["y"], np.zeros((30, 40)))
    monkeypatch.setenv("ONEMODEL_MAX_CONSTANT_ELEMENTS", "1000")
    with pytest.raises(OneModelError, match="1200 elements, more than the limit of 1000"):
        from_model(model)


def test_node_count_is_bounded_before_conversion(monkeypatch):
    nodes = [helper.make_node("Relu", [f"v{i}"], [f"v{i + 1}"]) for i in range(20)]
    graph = helper.make_graph(nodes, "chain",
                              [helper.make_tensor_value_info("v0", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("v20", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    assert len(from_model(model).nodes) == 20
    monkeypatch.setenv("ONEMODEL_MAX_NODES", "19")
    with pytest.raises(OneModelError, match="20 nodes, more than the limit of 19.*ONEMODEL_MAX"):
        from_model(model)


def test_flipped_weight_bytes_are_caught_by_the_recorded_checksum(tmp_path):
    path = tmp_path / "m.onnx"
    save_onnx(_small_graph(), path)
    model = onnx.load(str(path))
    assert KEY in {p.key for p in model.metadata_props}
    back = load_onnx(path)
    assert KEY not in back.metadata  # checked and dropped, never carried into other files
    np.testing.assert_array_equal(back.initializers["w"], _small_graph().initializers["w"])
    raw = bytearray(path.read_bytes())
    weights = np.arange(12, dtype=np.float32).tobytes()
    at = bytes(raw).index(weights) + 17
    raw[at] ^= 0x01
    path.write_bytes(bytes(raw))
    with pytest.raises(OneModelError, match="do not match the checksum OneModel recorded"):
        load_onnx(path)


def test_models_without_a_checksum_still_load(tmp_path):
    path = tmp_path / "m.onnx"
    save_onnx(_small_graph(), path)
    model = onnx.load(str(path))
    keep = [p for p in model.metadata_props if p.key != KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(keep)
    assert from_model(model).initializers["w"].shape == (4, 3)


def test_a_reexported_import_records_a_fresh_checksum(tmp_path):
    save_onnx(_small_graph(), tmp_path / "a.onnx")
    g = load_onnx(tmp_path / "a.onnx")
    g.initializers["w"] = g.initializers["w"] * 2
    save_onnx(g, tmp_path / "b.onnx")
    keys = [p.key for p in onnx.load(str(tmp_path / "b.onnx")).metadata_props]
    assert keys.count(KEY) == 1
    np.testing.assert_array_equal(load_onnx(tmp_path / "b.onnx").initializers["w"],
                                  g.initializers["w"])


_KILLED_WRITER = """
import os, signal, sys
os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)
sys.path.insert(0, {tests!r})
from test_onnx_hostile import _small_graph
from onemodel.onnx.export import save
save(_small_graph(), {path!r})
"""


def test_a_killed_writer_leaves_a_temp_file_that_the_next_save_removes(tmp_path):
    path = tmp_path / "m.onnx"
    code = _KILLED_WRITER.format(tests=os.path.dirname(__file__), path=str(path))
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    left = [p.name for p in tmp_path.iterdir()]
    assert len(left) == 1 and left[0].startswith(".m.onnx.onemodel-tmp-"), left
    save_onnx(_small_graph(), path)
    assert [p.name for p in tmp_path.iterdir()] == ["m.onnx"]
    assert Session.load(path).run({"x": np.ones((2, 4), np.float32)})["y"].shape == (2, 3)


def test_saved_files_get_the_usual_mode(tmp_path):
    old = os.umask(0o022)
    try:
        save_onnx(_small_graph(), tmp_path / "m.onnx")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "m.onnx").stat().st_mode) == 0o644
