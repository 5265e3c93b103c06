"""Checkpoints under hostile files: a checksum catches flipped bytes anywhere, hostile JSON and
malformed optimizer metadata are CheckpointErrors, the header is bounded before parsing, and a
writer killed mid-save leaves nothing the next save does not clean up."""

import contextlib
import json
import os
import signal
import stat
import struct
import subprocess
import sys
import textwrap
import zlib

import numpy as np
import pytest

from onemodel.tensors import Generator, OneModelError
from onemodel.training import SGD, Adam, Checkpoint, CheckpointError, Linear


def _saved(tmp_path, optimizer=None):
    path = tmp_path / "m.checkpoint"
    model = Linear(3, 4, Generator(0))
    Checkpoint.save(path, model, optimizer(model) if optimizer else None)
    return path


def _split(path):
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def _write(path, header: dict | bytes, data: bytes, *, fix_checksum=True):
    """Write a header (re-checksummed, as a hostile writer would) and data."""
    if isinstance(header, dict) and fix_checksum and "checksum" in header["__metadata__"]:
        header["__metadata__"].pop("checksum")
        crc = zlib.crc32(data, zlib.crc32(json.dumps(header, separators=(",", ":")).encode()))
        header["__metadata__"]["checksum"] = f"crc32:{crc:08x}"
    raw = header if isinstance(header, bytes) else json.dumps(
        header, separators=(",", ":")).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def test_a_flipped_weight_byte_is_caught(tmp_path):
    path = _saved(tmp_path)
    raw = bytearray(path.read_bytes())
    raw[-5] ^= 0x01  # inside the weights: the layout checks alone cannot see it
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="corrupt: the checksum does not match"):
        Checkpoint.load(path, Linear(3, 4))


def test_a_changed_header_value_is_caught(tmp_path):
    path = _saved(tmp_path, lambda m: SGD(m.parameters(), 0.125))
    header, data = _split(path)
    header["__metadata__"]["optimizer_groups"] = header["__metadata__"][
        "optimizer_groups"].replace("0.125", "0.126")
    _write(path, header, data, fix_checksum=False)
    with pytest.raises(CheckpointError, match="checksum does not match"):
        Checkpoint.load(path, Linear(3, 4), SGD(Linear(3, 4).parameters(), 1.0))


def test_a_version_2_file_without_its_checksum_is_refused_but_version_1_loads(tmp_path):
    path = _saved(tmp_path)
    header, data = _split(path)
    del header["__metadata__"]["checksum"]
    _write(path, header, data)
    with pytest.raises(CheckpointError, match="version 2 checkpoint without its checksum"):
        Checkpoint.load(path, Linear(3, 4))
    header["__metadata__"]["format_version"] = "1"
    _write(path, header, data)
    model = Linear(3, 4)
    Checkpoint.load(path, model)
    np.testing.assert_array_equal(model.weight.numpy(), Linear(3, 4, Generator(0)).weight.numpy())


@pytest.mark.parametrize("edit,message", [
    (lambda h: h.replace(b'"shape":[4,3]', b'"shape":[Infinity,3]'), "Infinity"),
    (lambda h: h.replace(b'"shape":[4,3]', b'"shape":[1e400,3]'), "out of range|Infinity"),
    (lambda h: h.replace(b'"shape":[4,3]', b'"shape":[18446744073709551616,3]'), "out of range"),
    (lambda h: h.replace(b'"shape":[4,3]', b'"shape":[4.0,3]'), "corrupt entry"),
    (lambda h: h.replace(b'"shape":[4,3]', b'"shape":[true,3]'), "corrupt entry"),
    (lambda h: h.replace(b'{"__metadata__"', b'{"x":' + b"[" * 100_000 + b"]" * 100_000
                         + b',"__metadata__"'), "nested too deeply"),
    (lambda h: b"\xff" + h[1:], "not valid JSON"),
])
def test_hostile_json_in_the_header_is_a_checkpoint_error(tmp_path, edit, message):
    path = _saved(tmp_path)
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    edited = edit(raw[8 : 8 + n])
    with contextlib.suppress(ValueError, RecursionError):  # re-checksum what json can read
        edited = json.loads(edited)
    _write(path, edited, raw[8 + n :])
    with pytest.raises(CheckpointError, match=message):
        Checkpoint.load(path, Linear(3, 4))


@pytest.mark.parametrize("key,value,message", [
    ("optimizer_groups", "Infinity", "not a list of tables"),
    ("optimizer_groups", "[" * 50_000 + "]" * 50_000, "nested too deeply"),
    ("optimizer_groups", "{}", "not a list of tables"),
    ("optimizer_groups", "[1]", "not a list of tables"),
    ("optimizer_groups", '[{"lr": 0.1}]', "no list of parameter indices"),
    ("optimizer_groups", '[{"params": ["a"], "lr": 0.1}]', "no list of parameter indices"),
    ("optimizer_groups", '[{"params": [0, 1], "lr": {"x": 1}, "momentum": 0}]',
     "hyperparameter 'lr'"),
    ("optimizer_groups", '[{"params": [0, 1], "lr": "fast", "momentum": 0.0}]',
     "hyperparameter 'lr' of group 0 is 'fast'"),
    ("optimizer_groups", '[{"params": [0, 1], "bogus": 1}]', "does not use"),
    ("optimizer_groups", '[{"params": [0, 1]}, {"params": []}]', "2 parameter groups"),
    ("optimizer_groups", "not json", "corrupt optimizer metadata"),
    ("optimizer_scalars", "[]", "not a table"),
    ("optimizer_scalars", '{"x": {}}', "not a parameter index"),
    ("optimizer_scalars", '{"0": 5}', "not a parameter index with a table"),
    ("optimizer_scalars", '{"0": {"step": {"a": 1}}}', "scalar state 'step'"),
    ("optimizer_scalars", '{"99": {"step": 1}}', "names parameter 99, which does not exist"),
])
def test_malformed_optimizer_metadata_is_a_checkpoint_error(tmp_path, key, value, message):
    path = _saved(tmp_path, lambda m: SGD(m.parameters(), 0.1, momentum=0.9))
    header, data = _split(path)
    header["__metadata__"][key] = value
    _write(path, header, data)
    target = Linear(3, 4, Generator(1))
    before = target.weight.numpy().copy()
    with pytest.raises(CheckpointError, match=message):
        Checkpoint.load(path, target, SGD(target.parameters(), 0.5, momentum=0.9))
    np.testing.assert_array_equal(target.weight.numpy(), before)


@pytest.mark.parametrize("name", ["optimizer/x/momentum_buffer", "optimizer/0", "optimizer/0/"])
def test_malformed_optimizer_tensor_names_are_checkpoint_errors(tmp_path, name):
    path = _saved(tmp_path, lambda m: SGD(m.parameters(), 0.1, momentum=0.9))
    header, data = _split(path)
    header[name] = {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}
    _write(path, header, data)
    with pytest.raises(CheckpointError, match="optimizer/<index>/<name>"):
        Checkpoint.load(path, Linear(3, 4), SGD(Linear(3, 4).parameters(), 0.5, momentum=0.9))


def test_a_round_trip_with_adam_betas_still_works(tmp_path):
    path = _saved(tmp_path, lambda m: Adam(m.parameters(), 0.01, betas=(0.8, 0.9)))
    opt = Adam(Linear(3, 4).parameters(), 0.5)
    Checkpoint.load(path, Linear(3, 4), opt)
    assert opt.param_groups[0]["betas"] == (0.8, 0.9) and opt.param_groups[0]["lr"] == 0.01


def test_a_255_mib_header_is_refused_by_default(tmp_path):
    path = tmp_path / "big.checkpoint"
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", 255 * 2**20) + b"{}")
        f.truncate(8 + 255 * 2**20)  # sparse
    with pytest.raises(CheckpointError, match="more than the limit of 67108864"):
        Checkpoint.load(path, Linear(3, 4))


def test_the_header_length_is_bounded_before_parsing(tmp_path, monkeypatch):
    path = _saved(tmp_path)
    monkeypatch.setenv("ONEMODEL_MAX_HEADER_BYTES", "64")
    with pytest.raises(CheckpointError, match="more than the limit of 64.*ONEMODEL_MAX_HEADER"):
        Checkpoint.load(path, Linear(3, 4))


_KILLED_WRITER = """
import os, signal
os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)
from onemodel.tensors import Generator
from onemodel.training import Checkpoint, Linear
Checkpoint.save({path!r}, Linear(3, 4, Generator(0)))
"""


def test_a_killed_writer_leaves_a_temp_file_that_the_next_save_removes(tmp_path):
    path = tmp_path / "m.checkpoint"
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(
        _KILLED_WRITER.format(path=str(path)))], capture_output=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    left = [p.name for p in tmp_path.iterdir()]
    assert len(left) == 1 and left[0].startswith(".m.checkpoint.onemodel-tmp-"), left
    Checkpoint.save(path, Linear(3, 4, Generator(0)))
    assert [p.name for p in tmp_path.iterdir()] == ["m.checkpoint"]


def test_saved_files_get_the_usual_mode(tmp_path):
    old = os.umask(0o022)
    try:
        path = _saved(tmp_path)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_errors_are_onemodel_errors():
    assert issubclass(CheckpointError, OneModelError)
