"""The .onemodel loader under hostile headers (valid checksums, hostile JSON): every case is a
NativeFormatError, sizes are bounded before parsing, and writers killed mid-save leave nothing
the next save does not clean up."""

from __future__ import annotations

import json
import os
import signal
import stat
import struct
import subprocess
import sys
import textwrap
import time
import zlib
from pathlib import Path

import pytest

from onemodel.native.format import NativeFormatError
from onemodel.runtime import load, save
from onemodel.tensors import OneModelError

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "packages" / "runtime" / "tests"))
from runtime_graphs import mlp


def _file(raw: bytes, data: bytes = b"") -> bytes:
    raw += b" " * (-(40 + len(raw)) % 64)
    return struct.pack("<8sIIQQII", b"ONEMODEL", 1, 0, len(raw), len(data), zlib.crc32(raw),
                       zlib.crc32(data)) + raw + data


def _header_of(graph, tmp_path) -> tuple[dict, bytes]:
    path = tmp_path / "good.onemodel"
    save(graph, path)
    good = path.read_bytes()
    hlen = struct.unpack("<Q", good[16:24])[0]
    return json.loads(good[40 : 40 + hlen]), good[40 + hlen :]


def _load(tmp_path, data: bytes):
    path = tmp_path / "bad.onemodel"
    path.write_bytes(data)
    return load(path)


def _chain(n: int) -> bytes:
    nodes = ",".join(f'{{"op":"Relu","name":"r{i}","inputs":["v{i}"],"outputs":["v{i + 1}"],'
                     f'"attrs":{{}}}}' for i in range(n))
    return (f'{{"name":"chain","metadata":{{}},"inputs":[{{"name":"v0","dtype":"F32","shape":'
            f'["batch",3]}}],"outputs":[{{"name":"v{n}","dtype":"F32","shape":["batch",3]}}],'
            f'"nodes":[{nodes}],"initializers":[]}}').encode()


@pytest.mark.parametrize("edit,message", [
    (lambda h: h.replace(b'"shape":[784,256]', b'"shape":[Infinity,256]'), "not a count"),
    (lambda h: h.replace(b'"shape":[784,256]', b'"shape":[1e400,256]'), "not a count"),
    (lambda h: h.replace(b'"shape":[784,256]', b'"shape":[784.0,256]'), "not a count"),
    (lambda h: h.replace(b'"shape":[784,256]', b'"shape":[18446744073709551616,256]'),
     "out of range"),
    (lambda h: h.replace(b'"shape":[784,256]', b'"shape":[4294967296,4294967296]'),
     "corrupt entry"),
    (lambda h: h.replace(b'"offset":0', b'"offset":-8'), "not a count"),
    (lambda h: h.replace(b'"nodes":[', b'"nodes":[' + b"[" * 100_000 + b"]" * 100_000 + b","),
     "nested too deeply"),
    (lambda h: h.replace(b'"shape":["batch",784]', b'"shape":["batch // 0",784]'),
     "division by 0"),
    (lambda h: h.replace(b'"shape":["batch",784]',
                         b'"shape":["' + b"(" * 5000 + b"batch" + b")" * 5000 + b'",784]'),
     "longer than 1000 characters"),
    (lambda h: h.replace(b'"shape":["batch",784]', b'"shape":["' + b"(" * 40 + b"batch"
                         + b")" * 40 + b'",784]'), "nested more than 32 deep"),
    (lambda h: h.replace(b'"shape":["batch",784]', b'"shape":["' + b"9" * 5000 + b'",784]'),
     "longer than 1000|more than 18 digits"),
    (lambda h: h.replace(b'"shape":["batch",784]', b'"shape":[true,784]'), "True"),
    (lambda h: h.replace(b'"shape":["batch",784]', b'"shape":[-3,784]'), "out of range"),
    (lambda h: h.replace(b'"dtype":"F32"', b'"dtype":["F32"]', 1), "unknown dtype"),
    (lambda h: h.replace(b'"inputs":["input"', b'"inputs":[7'), "not a list of text"),
    (lambda h: h.replace(b'"nodes":[', b'"nodes":[{"op":"Relu","inputs":["input"],'
                         b'"outputs":["z"],"attrs":{"x":{"i":1.5}}},'), "not an integer"),
    (lambda h: h.replace(b'"nodes":[', b'"nodes":[{"op":"Relu","inputs":["input"],'
                         b'"outputs":["z"],"attrs":{"x":{"b":"yes"}}},'), "corrupt attribute"),
    (lambda h: h.replace(b'"metadata":{}', b'"metadata":{"k":[1]}'), "not text"),
    (lambda h: b'"just a string"', "not a table"),
    (lambda h: h.replace(b'"inputs":["input"', b'"inputs":[""', 1),
     "missing required input A of MatMul"),
])
def test_hostile_headers_with_valid_checksums_are_native_format_errors(tmp_path, edit, message):
    header, data = _header_of(mlp(sizes=(784, 256, 10)), tmp_path)
    raw = edit(json.dumps(header, separators=(",", ":")).encode())
    with pytest.raises(NativeFormatError, match=message):
        _load(tmp_path, _file(raw, data))


def test_the_header_length_is_bounded_before_it_is_read(tmp_path, monkeypatch):
    # 255 MiB of header once cost 6.7 GB and 14 s; now the length alone is refused
    path = tmp_path / "big.onemodel"
    hlen = 255 * 2**20
    with open(path, "wb") as f:
        f.write(struct.pack("<8sIIQQII", b"ONEMODEL", 1, 0, hlen, 0, 0, 0))
        f.write(b"{}")
        f.truncate(40 + hlen)  # sparse: no disk or memory spent here
    start = time.perf_counter()
    with pytest.raises(NativeFormatError, match="more than the limit of 67108864.*"
                                                "ONEMODEL_MAX_HEADER_BYTES"):
        load(path)
    assert time.perf_counter() - start < 5  # generous: the check reads 40 bytes
    monkeypatch.setenv("ONEMODEL_MAX_HEADER_BYTES", "100")
    save(mlp(sizes=(3, 2)), tmp_path / "m.onemodel")
    with pytest.raises(NativeFormatError, match="more than the limit of 100"):
        load(tmp_path / "m.onemodel")
    monkeypatch.setenv("ONEMODEL_MAX_HEADER_BYTES", "lots")
    with pytest.raises(OneModelError, match="ONEMODEL_MAX_HEADER_BYTES='lots' is not a whole"):
        load(tmp_path / "m.onemodel")


def test_the_node_count_is_bounded_before_nodes_are_built(tmp_path, monkeypatch):
    assert len(_load(tmp_path, _file(_chain(50))).nodes) == 50
    monkeypatch.setenv("ONEMODEL_MAX_NODES", "49")
    with pytest.raises(NativeFormatError, match="more than 49 nodes"):  # counted before parsing
        _load(tmp_path, _file(_chain(50)))
    spaced = _chain(50).replace(b'"op":', b'"op" :')  # hides from the count: caught after parsing
    with pytest.raises(NativeFormatError, match="50 nodes, more than the limit of 49"):
        _load(tmp_path, _file(spaced))


def test_a_million_node_chain_is_refused_by_default(tmp_path):
    # once 60-90 s and 2.2 GB; its 85 MB header is over the default header limit
    with pytest.raises(NativeFormatError, match="more than the limit"):
        _load(tmp_path, _file(_chain(1_000_000)))


_KILLED_WRITER = """
import os, signal, sys
os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)
sys.path.insert(0, {tests!r})
from runtime_graphs import mlp
from onemodel.runtime import save
save(mlp(sizes=(3, 2)), {path!r})
"""


def test_a_killed_writer_leaves_a_temp_file_that_the_next_save_removes(tmp_path):
    path = tmp_path / "m.onemodel"
    tests = str(Path(__file__).resolve().parents[3] / "packages" / "runtime" / "tests")
    for _ in range(3):  # each killed writer removes the temp file of the one before
        proc = subprocess.run([sys.executable, "-c", textwrap.dedent(
            _KILLED_WRITER.format(tests=tests, path=str(path)))], capture_output=True)
        assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
        left = sorted(p.name for p in tmp_path.iterdir())
        assert len(left) == 1 and left[0].startswith(".m.onemodel.onemodel-tmp-"), left
    (tmp_path / ".other.onemodel.onemodel-tmp-1-0").write_bytes(b"")  # not ours to remove
    save(mlp(sizes=(3, 2)), path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.onemodel.onemodel-tmp-1-0",
                                                          "m.onemodel"]
    assert load(path).name == "mlp"


def test_a_live_writers_temp_file_is_left_alone(tmp_path):
    live = tmp_path / f".m.onemodel.onemodel-tmp-{os.getppid()}-0"
    live.write_bytes(b"in progress")
    save(mlp(sizes=(3, 2)), tmp_path / "m.onemodel")
    assert live.exists()


def test_saved_files_get_the_usual_mode(tmp_path):
    old = os.umask(0o027)
    try:
        save(mlp(sizes=(3, 2)), tmp_path / "m.onemodel")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "m.onemodel").stat().st_mode) == 0o640
