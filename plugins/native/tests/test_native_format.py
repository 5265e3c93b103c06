"""The .onemodel format: exact round trips, zero-copy loading, atomic writes, and a clear error
for every truncation, flipped byte and absurd length."""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import numpy as np
import pytest

from onemodel.native.format import NativeFormatError
from onemodel.runtime import GraphBuilder, Session, load, save
from onemodel.tensors import DimExpr, DType, OneModelError

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "packages" / "runtime" / "tests"))
from runtime_graphs import attention, conv_net, mlp, random_feeds


def _same_graph(a, b):
    assert (a.name, a.metadata) == (b.name, b.metadata)
    assert [(v.name, v.dtype, v.shape) for v in a.inputs] == [(v.name, v.dtype, v.shape)
                                                              for v in b.inputs]
    assert [(v.name, v.dtype, v.shape) for v in a.outputs] == [(v.name, v.dtype, v.shape)
                                                               for v in b.outputs]
    assert [(n.op, n.name, n.inputs, n.outputs) for n in a.nodes] == [
        (n.op, n.name, n.inputs, n.outputs) for n in b.nodes]
    for na, nb in zip(a.nodes, b.nodes):
        assert {k: tuple(v) if isinstance(v, list) else v for k, v in na.attrs.items()} == nb.attrs
    assert list(a.initializers) == list(b.initializers)
    for k in a.initializers:
        assert a.initializers[k].dtype == b.initializers[k].dtype
        assert np.array_equal(a.initializers[k], b.initializers[k])


@pytest.mark.parametrize("make", [mlp, conv_net, attention])
def test_round_trip_is_exact(tmp_path, make):
    g = make()
    g.metadata = {"producer": "test", "note": "ünïcode"}
    path = tmp_path / "m.onemodel"
    save(g, path)
    back = load(path)
    _same_graph(g, back)
    feeds = random_feeds(g, {"batch": 3, "seq": 4})
    a, b = Session(g).run(feeds)["output"], Session.load(path).run(feeds)["output"]
    assert np.array_equal(a.numpy(), b.numpy())


def test_attributes_and_symbolic_expressions_survive(tmp_path):
    b = GraphBuilder("attrs")
    x = b.input("x", DType.F32, ("batch", 4))
    y = b.op("Cast", x, to=DType.F64)
    y = b.op("Gelu", b.op("Cast", y, to=DType.F32), approximate="tanh")
    y = b.op("Clip", y, b.const(np.float32(-1)), None)
    b.output(y, "y")
    g = b.build()
    g.outputs[0].shape = (DimExpr.symbol("batch") * 2 + 1, 4)
    path = tmp_path / "a.onemodel"
    save(g, path)
    back = load(path)
    assert back.nodes[0].attrs == {"to": DType.F64}
    assert back.nodes[2].attrs == {"approximate": "tanh"}
    assert back.nodes[3].inputs[2] == ""
    assert back.outputs[0].shape == (DimExpr.symbol("batch") * 2 + 1, 4)


def test_loading_maps_without_copying(tmp_path):
    path = tmp_path / "m.onemodel"
    save(mlp(), path)
    w = load(path).initializers["fc0.weight"]
    assert not w.flags.owndata and not w.flags.writeable
    assert w.ctypes.data % 64 == 0  # aligned in the file and in memory


def test_save_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "m.onemodel"
    save(mlp(sizes=(3, 2)), path)
    before = path.read_bytes()
    monkeypatch.setattr("os.fsync", lambda fd: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError, match="disk full"):
        save(mlp(sizes=(5, 2)), path)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["m.onemodel"]


@pytest.fixture(scope="module")
def good_bytes(tmp_path_factory):
    path = tmp_path_factory.mktemp("good") / "m.onemodel"
    save(conv_net(), path)
    return path.read_bytes()


def _load_bytes(tmp_path, data: bytes):
    path = tmp_path / "bad.onemodel"
    path.write_bytes(data)
    return load(path)


def test_every_truncation_is_refused(tmp_path, good_bytes):
    cuts = sorted({0, 1, 7, 8, 20, 39, 40, 41, 100, len(good_bytes) // 2, len(good_bytes) - 1}
                  | set(range(0, len(good_bytes), max(1, len(good_bytes) // 40))))
    for cut in cuts:
        with pytest.raises(NativeFormatError, match="truncated|corrupt|magic"):
            _load_bytes(tmp_path, good_bytes[:cut])


def test_flipped_bytes_are_refused(tmp_path, good_bytes):
    rng = np.random.default_rng(0)
    positions = sorted(set(rng.integers(0, len(good_bytes), 60).tolist()) | {0, 9, 17, 25, 33, 37})
    for pos in positions:
        bad = bytearray(good_bytes)
        bad[pos] ^= 0x5A
        with pytest.raises(NativeFormatError):
            _load_bytes(tmp_path, bytes(bad))


@pytest.mark.parametrize("field,value,message", [
    (16, 2**62, "truncated or corrupt"),  # header length
    (24, 2**40, "truncated or corrupt"),  # data length
    (8, 99, "format version 99 is newer"),
])
def test_absurd_lengths_and_newer_versions(tmp_path, good_bytes, field, value, message):
    bad = bytearray(good_bytes)
    fmt = "<I" if field == 8 else "<Q"
    bad[field : field + struct.calcsize(fmt)] = struct.pack(fmt, value)
    with pytest.raises(NativeFormatError, match=message):
        _load_bytes(tmp_path, bytes(bad))


def test_a_consistent_but_lying_header_is_refused(tmp_path, good_bytes):
    # rewrite the header so an initializer claims more bytes than the data has, fix the CRCs
    import json
    import zlib

    hlen, _dlen = struct.unpack("<QQ", good_bytes[16:32])
    header = json.loads(good_bytes[40 : 40 + hlen])
    header["initializers"][0]["shape"] = [10**6, 3, 3, 3]
    header["initializers"][0]["nbytes"] = 10**6 * 27 * 4
    raw = json.dumps(header).encode()
    raw += b" " * (-(40 + len(raw)) % 64)
    data = good_bytes[40 + hlen :]
    fixed = struct.pack("<8sIIQQII", b"ONEMODEL", 1, 0, len(raw), len(data), zlib.crc32(raw),
                        zlib.crc32(data))
    with pytest.raises(NativeFormatError, match="truncated: initializer 'c1.w' ends at byte"):
        _load_bytes(tmp_path, fixed + raw + data)


def test_errors_are_onemodel_errors_that_name_the_file(tmp_path):
    with pytest.raises(OneModelError, match="no such file"):
        load(tmp_path / "missing.onemodel")
    (tmp_path / "x.onemodel").write_bytes(b"PK\x03\x04 definitely not ours" * 4)
    with pytest.raises(NativeFormatError, match="x.onemodel: not a .onemodel file"):
        load(tmp_path / "x.onemodel")


def test_found_by_magic_bytes_without_the_extension(tmp_path):
    path = tmp_path / "model.bin"
    save(mlp(sizes=(3, 2)), tmp_path / "m.onemodel")
    path.write_bytes((tmp_path / "m.onemodel").read_bytes())
    assert load(path).name == "mlp"
