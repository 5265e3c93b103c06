"""Checkpoint: exact round trips, atomic writes, and clear errors for every kind of bad file."""

import json
import struct

import numpy as np
import pytest

from onemodel.tensors import Generator, OneModelError, Tensor
from onemodel.training import SGD, Adam, BatchNorm1d, Checkpoint, CheckpointError, Linear, Sequential


def _model(seed=0):
    return Sequential(Linear(3, 4, Generator(seed)), BatchNorm1d(4), Linear(4, 2, Generator(seed)))


def _train_one_step(model, opt):
    x = Tensor.randn(5, 3, generator=Generator(1))
    opt.zero_grad()
    (model(x) ** 2).mean().backward()
    opt.step()


def test_round_trip_with_optimizer_is_exact(tmp_path):
    model = _model()
    opt = Adam(model.parameters(), 0.01)
    _train_one_step(model, opt)
    path = tmp_path / "m.checkpoint"
    Checkpoint.save(path, model, opt)
    fresh = _model(seed=5)
    fresh_opt = Adam(fresh.parameters(), 0.5)
    meta = Checkpoint.load(path, fresh, fresh_opt)
    assert meta["model"] == "Sequential" and meta["format_version"] == "2"
    for (k, a), b in zip(model.state_dict().items(), fresh.state_dict().values()):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=k)
    assert fresh_opt.param_groups[0]["lr"] == 0.01
    _train_one_step(model, opt)
    _train_one_step(fresh, fresh_opt)
    for a, b in zip(model.parameters(), fresh.parameters()):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_layout_is_safetensors(tmp_path):
    path = tmp_path / "m.checkpoint"
    Checkpoint.save(path, Linear(2, 3, Generator(0)))
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    assert header["model/weight"] == {"dtype": "F32", "shape": [3, 2], "data_offsets": [0, 24]}
    assert header["__metadata__"]["format"] == "onemodel-checkpoint"
    assert (8 + n) % 8 == 0


def test_save_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "m.checkpoint"
    model = Linear(2, 2, Generator(0))
    Checkpoint.save(path, model)
    before = path.read_bytes()

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr("os.fsync", boom)
    with pytest.raises(OSError, match="disk full"):
        Checkpoint.save(path, Linear(2, 2, Generator(9)))
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["m.checkpoint"]


def test_wrong_model_names_the_keys_and_changes_nothing(tmp_path):
    path = tmp_path / "m.checkpoint"
    Checkpoint.save(path, Linear(3, 4, Generator(0)))
    other = Linear(3, 5, Generator(1))
    before = other.weight.numpy().copy()
    with pytest.raises(CheckpointError, match=r"mis-shaped keys: weight: expected \[5, 3\], got \[4, 3\]"):
        Checkpoint.load(path, other)
    np.testing.assert_array_equal(other.weight.numpy(), before)
    with pytest.raises(CheckpointError, match=r"missing keys: 0.weight.*unexpected keys: weight"):
        Checkpoint.load(path, _model())


def test_optimizer_mismatch_changes_nothing(tmp_path):
    path = tmp_path / "m.checkpoint"
    model = Linear(3, 4, Generator(0))
    Checkpoint.save(path, model, SGD(model.parameters(), 0.1, momentum=0.9))
    target = Linear(3, 4, Generator(1))
    before = target.weight.numpy().copy()
    with pytest.raises(CheckpointError, match="optimizer state is for SGD, not Adam"):
        Checkpoint.load(path, target, Adam(target.parameters()))
    np.testing.assert_array_equal(target.weight.numpy(), before)
    with pytest.raises(CheckpointError, match="holds no optimizer state"):
        Checkpoint.save(path, model) or Checkpoint.load(path, target, SGD(target.parameters(), 1))


@pytest.mark.parametrize("cut", [0, 5, 8, 20, -1, -13])
def test_truncated_files_raise(tmp_path, cut):
    path = tmp_path / "m.checkpoint"
    Checkpoint.save(path, Linear(3, 4, Generator(0)))
    raw = path.read_bytes()
    path.write_bytes(raw[:cut])
    with pytest.raises(CheckpointError, match=r"truncated|corrupt"):
        Checkpoint.load(path, Linear(3, 4))


def test_flipped_bytes_and_huge_lengths_raise(tmp_path):
    path = tmp_path / "m.checkpoint"
    Checkpoint.save(path, Linear(3, 4, Generator(0)))
    raw = bytearray(path.read_bytes())
    n = struct.unpack("<Q", raw[:8])[0]
    for mutate in (
        lambda b: b.__setitem__(slice(0, 8), struct.pack("<Q", 2**62)),
        lambda b: b.__setitem__(10, ord("!")),
        lambda b: b.__setitem__(slice(8, 8 + n), bytes(b[8 : 8 + n]).replace(b'"shape":[4,3]',
                                                                             b'"shape":[9,3]')),
        lambda b: b.__setitem__(slice(8, 8 + n), bytes(b[8 : 8 + n]).replace(b'"F32"', b'"X32"')),
    ):
        bad = bytearray(raw)
        mutate(bad)
        path.write_bytes(bytes(bad))
        with pytest.raises(CheckpointError):
            Checkpoint.load(path, Linear(3, 4))


def test_newer_format_version_is_refused(tmp_path):
    path = tmp_path / "m.checkpoint"
    Checkpoint.save(path, Linear(1, 1))
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = raw[8 : 8 + n].replace(b'"format_version":"2"', b'"format_version":"7"')
    path.write_bytes(raw[:8] + header + raw[8 + n :])
    with pytest.raises(CheckpointError, match="version 7 is newer than this OneModel reads"):
        Checkpoint.load(path, Linear(1, 1))


def test_missing_file_and_errors_are_onemodel_errors(tmp_path):
    with pytest.raises(OneModelError, match="no such checkpoint file"):
        Checkpoint.load(tmp_path / "nope.checkpoint", Linear(1, 1))
