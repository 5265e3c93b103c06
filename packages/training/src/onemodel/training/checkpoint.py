"""``Checkpoint``: model (and optimizer) state in a safetensors-layout file that never runs code.

Layout (readable by any safetensors reader): 8-byte little-endian header length, a JSON header
mapping tensor names to dtype, shape and byte offsets plus a ``__metadata__`` table of strings,
then the tensor bytes. OneModel's metadata: ``format`` = ``onemodel-checkpoint``,
``format_version``, the model class, parameter names, and the optimizer's class, hyperparameters
and scalar state as JSON. Tensors are named ``model/<state-dict key>`` and
``optimizer/<parameter index>/<state name>``.

Since format version 2 the metadata holds ``checksum`` = ``crc32:<8 hex digits>``: a CRC-32 of
the header as written without that entry, then of the data section, so a flipped bit anywhere
is found (version 1 files, which have none, still load).

Writing goes to a temporary file in the same folder, then replaces the target atomically.
Loading checks the header length against ``ONEMODEL_MAX_HEADER_BYTES`` before parsing it,
parses it strictly, verifies the checksum, checks every length and offset against the file
before allocating, checks that the file (optimizer metadata included) fits the model and
optimizer, and only then copies values in: a failed load changes nothing.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from onemodel.tensors import DType, OneModelError, devices
from onemodel.tensors.fileio import atomic_write, load_limit, read_json

from .module import Module
from .optim.optimizer import Optimizer

FORMAT = "onemodel-checkpoint"
FORMAT_VERSION = 2
_CHECKSUM = "checksum"


class CheckpointError(OneModelError):
    """A checkpoint file is corrupt, truncated, too new, or of another model."""


class Checkpoint:
    """Save and load a model's parameters and buffers, and optionally an optimizer's state."""

    @staticmethod
    def save(path: str | os.PathLike, model: Module, optimizer: Optimizer | None = None) -> None:
        tensors: dict[str, np.ndarray] = {}
        for name, t in model.state_dict().items():
            tensors[f"model/{name}"] = _contiguous(t.cpu().numpy())  # host arrays, any device
        meta: dict[str, str] = {
            "format": FORMAT,
            "format_version": str(FORMAT_VERSION),
            "model": type(model).__name__,
            "parameters": json.dumps(list(model.state_dict())),
        }
        if optimizer is not None:
            sd = optimizer.state_dict()
            scalars: dict[str, dict[str, Any]] = {}
            for idx, state in sd["state"].items():
                for k, v in state.items():
                    if isinstance(v, np.ndarray):
                        tensors[f"optimizer/{idx}/{k}"] = _contiguous(v)
                    else:
                        scalars.setdefault(str(idx), {})[k] = _json_scalar(v)
            meta["optimizer"] = type(optimizer).__name__
            meta["optimizer_groups"] = json.dumps(sd["param_groups"], default=_json_scalar)
            meta["optimizer_scalars"] = json.dumps(scalars)
        write_safetensors(path, tensors, meta)

    @staticmethod
    def load(path: str | os.PathLike, model: Module, optimizer: Optimizer | None = None) -> dict:
        """Load into ``model`` (and ``optimizer``) in place; returns the file's metadata."""
        tensors, meta = read_safetensors(path)
        if meta.get("format") != FORMAT:
            raise CheckpointError(f"{path}: not a OneModel checkpoint (format "
                                  f"{meta.get('format')!r})")
        _check_version(meta, path)
        state = {k[len("model/"):]: v for k, v in tensors.items() if k.startswith("model/")}
        try:
            plan = model._fit_state_dict(state, strict=True)
        except OneModelError as exc:
            raise CheckpointError(
                f"{path}: the checkpoint (of a {meta.get('model', '?')}) does not fit this "
                f"{type(model).__name__}: {exc}"
            ) from None
        opt_state = None
        if optimizer is not None:
            if "optimizer" not in meta:
                raise CheckpointError(f"{path}: the checkpoint holds no optimizer state")
            if meta["optimizer"] != type(optimizer).__name__:
                raise CheckpointError(f"{path}: optimizer state is for {meta['optimizer']}, not "
                                      f"{type(optimizer).__name__}")
            opt_state = _optimizer_state(tensors, meta, path)
            _check_groups(opt_state["param_groups"], optimizer, path)
            try:
                optimizer._check_state_dict(opt_state)
            except OneModelError as exc:
                raise CheckpointError(f"{path}: {exc}") from None
        for target, arr in plan:
            devices.assign(target, arr)
        if opt_state is not None:
            optimizer.load_state_dict(opt_state)
        return meta


    @staticmethod
    def save_weights(path: str | os.PathLike, model: Module,
                     metadata: dict[str, str] | None = None) -> None:
        """Write the model's state dict as a plain safetensors file under PyTorch's names (no
        prefix), the layout ``safetensors.torch.load_file`` reads and
        ``torch_model.load_state_dict`` takes when both models name their layers alike."""
        tensors = {name: _contiguous(t.cpu().numpy()) for name, t in model.state_dict().items()}
        meta = {"format": "pt", **(metadata or {})}
        if meta["format"] == FORMAT:
            raise CheckpointError("save_weights writes plain weights; use Checkpoint.save for a "
                                  "OneModel checkpoint")
        write_safetensors(path, tensors, meta)

    @staticmethod
    def load_weights(path: str | os.PathLike, model: Module, strict: bool = True):
        """Load a safetensors file of weights (PyTorch's ``save_file``, ``save_weights`` or the
        model part of a OneModel checkpoint) into ``model``; returns (missing, unexpected)."""
        return model.load_state_dict(read_weights(path), strict=strict)


def read_weights(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The state dict in a safetensors file: every tensor by name, or a OneModel checkpoint's
    ``model/`` part without the prefix."""
    tensors, meta = read_safetensors(path)
    if meta.get("format") == FORMAT:
        return {k[len("model/"):]: v for k, v in tensors.items() if k.startswith("model/")}
    return tensors


def _optimizer_state(tensors, meta, path) -> dict:
    """The optimizer's state_dict from the file, every field checked for its type first."""
    def bad(what: str) -> CheckpointError:
        return CheckpointError(f"{path}: corrupt optimizer metadata: {what}")

    try:
        groups = read_json(meta["optimizer_groups"], "optimizer_groups", allow_nonfinite=True)
        scalars = read_json(meta.get("optimizer_scalars", "{}"), "optimizer_scalars",
                            allow_nonfinite=True)
    except KeyError:
        raise bad("optimizer_groups is missing") from None
    except OneModelError as exc:
        raise CheckpointError(f"{path}: corrupt optimizer metadata ({exc})") from None
    if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
        raise bad("optimizer_groups is not a list of tables")
    for g in groups:
        params = g.get("params")
        if not isinstance(params, list) or not all(_is_index(i) for i in params):
            raise bad("a parameter group has no list of parameter indices")
        for k, v in g.items():
            if k != "params" and not _is_hyper(v):
                raise bad(f"hyperparameter {k!r} = {v!r} is not a number, flag or list of "
                          "numbers")
        if isinstance(g.get("betas"), list):
            g["betas"] = tuple(g["betas"])
    if not isinstance(scalars, dict):
        raise bad("optimizer_scalars is not a table")
    state: dict[int, dict[str, Any]] = {}
    for k, v in tensors.items():
        if k.startswith("optimizer/"):
            parts = k.split("/", 2)
            if len(parts) != 3 or not parts[1].isdecimal() or not parts[2]:
                raise bad(f"tensor {k!r} is not named optimizer/<index>/<name>")
            state.setdefault(int(parts[1]), {})[parts[2]] = v
    for idx, entries in scalars.items():
        if not idx.isdecimal() or not isinstance(entries, dict):
            raise bad(f"scalar state {idx!r} is not a parameter index with a table")
        for name, v in entries.items():
            if not _is_hyper(v):
                raise bad(f"scalar state {name!r} of parameter {idx} is {v!r}")
        state.setdefault(int(idx), {}).update(entries)
    return {"state": state, "param_groups": groups}


def _is_index(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_hyper(v) -> bool:
    return (v is None or isinstance(v, (bool, str)) or _is_number(v)
            or (isinstance(v, list) and all(_is_number(x) for x in v)))


def _check_groups(groups: list, optimizer: Optimizer, path) -> None:
    """Saved hyperparameters must be the kind this optimizer uses (a number for a number...)."""
    if len(groups) != len(optimizer.param_groups):
        raise CheckpointError(f"{path}: the checkpoint has {len(groups)} parameter groups, this "
                              f"optimizer {len(optimizer.param_groups)}")
    for i, (saved, current) in enumerate(zip(groups, optimizer.param_groups)):
        for k, v in saved.items():
            if k == "params":
                continue
            if k not in current:
                raise CheckpointError(f"{path}: parameter group {i} has hyperparameter {k!r}, "
                                      f"which {type(optimizer).__name__} does not use")
            now = current[k]
            same = (now is None or v is None
                    or (isinstance(now, bool) and isinstance(v, bool))
                    or (_is_number(now) and _is_number(v))
                    or (isinstance(now, str) and isinstance(v, str))
                    or (isinstance(now, (tuple, list)) and isinstance(v, (tuple, list))
                        and len(now) == len(v)))
            if not same:
                raise CheckpointError(f"{path}: corrupt optimizer metadata: hyperparameter {k!r} "
                                      f"of group {i} is {v!r}, {type(optimizer).__name__} "
                                      f"expects a value like {now!r}")


def _contiguous(arr: np.ndarray) -> np.ndarray:
    # not np.ascontiguousarray: it turns 0-d arrays into 1-d ones
    return arr if arr.flags.c_contiguous else arr.copy(order="C")


def _json_scalar(v):
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        return float(v)
    if isinstance(v, tuple):
        return list(v)
    if isinstance(v, (int, float, bool, str, list)) or v is None:
        return v
    raise CheckpointError(f"cannot store {type(v).__name__} in a checkpoint")


def _int(value, path) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise CheckpointError(f"{path}: missing or corrupt format_version") from None


# the safetensors layout ------------------------------------------------------------------------

def write_safetensors(path, tensors: dict[str, np.ndarray], metadata: dict[str, str]) -> None:
    """Write ``tensors`` atomically: a temporary file in the same folder, then a rename."""
    metadata = {k: v for k, v in metadata.items() if k != _CHECKSUM}
    header: dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    for name, arr in tensors.items():
        dt = DType.from_numpy(arr.dtype)
        header[name] = {"dtype": dt.name, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + arr.nbytes]}
        offset += arr.nbytes
    blobs = [arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
             for arr in tensors.values()]
    crc = zlib.crc32(_canonical(header))
    for blob in blobs:
        crc = zlib.crc32(blob, crc)
    metadata[_CHECKSUM] = f"crc32:{crc:08x}"
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-(len(raw) + 8) % 8)  # data starts 8-byte aligned
    atomic_write(path, [struct.pack("<Q", len(raw)), raw, *blobs])


def _canonical(header: dict) -> bytes:
    """The header's bytes as the writer checksums them (without the checksum entry)."""
    return json.dumps(header, separators=(",", ":")).encode()


def read_safetensors(path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Read and validate a safetensors-layout file; every size is checked before use."""
    path = Path(path)
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed by the with-block below
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such checkpoint file") from None
    with f:  # the lengths are checked before the file is read
        size = os.fstat(f.fileno()).st_size
        if size < 8:
            raise CheckpointError(f"{path}: truncated (only {size} bytes)")
        (n,) = struct.unpack("<Q", f.read(8))
        if 8 + n > size:
            raise CheckpointError(f"{path}: corrupt or truncated header (claims {n} bytes, file "
                                  f"has {size - 8})")
        limit = load_limit("HEADER_BYTES")
        if n > limit:
            raise CheckpointError(f"{path}: the header is {n} bytes, more than the limit of "
                                  f"{limit}; raise ONEMODEL_MAX_HEADER_BYTES if this checkpoint "
                                  "is genuine")
        data = bytearray(size)
        f.seek(0)
        if f.readinto(data) != size:
            raise CheckpointError(f"{path}: the file changed while it was read")
    try:
        header = read_json(memoryview(data)[8 : 8 + n])
    except OneModelError as exc:
        raise CheckpointError(f"{path}: {exc}") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: corrupt header (not a table)")
    meta = header.get("__metadata__", {}) or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise CheckpointError(f"{path}: corrupt metadata")
    body = memoryview(data)[8 + n :]
    if meta.get("format") == FORMAT:
        _check_version(meta, path)  # a newer version may checksum differently: check it first
    if _CHECKSUM in meta:
        _verify(header, meta, body, path)
    header.pop("__metadata__", None)
    tensors: dict[str, np.ndarray] = {}
    spans = []
    for name, info in header.items():
        try:
            dt = DType[info["dtype"]]
            shape = [_whole(d) for d in info["shape"]]
            begin, end = (_whole(v) for v in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"{path}: corrupt entry for tensor {name!r}") from None
        if any(d < 0 for d in shape) or not 0 <= begin <= end:
            raise CheckpointError(f"{path}: corrupt shape or offsets for tensor {name!r}")
        if end > len(body):
            raise CheckpointError(f"{path}: truncated: tensor {name!r} ends at byte {end} of a "
                                  f"{len(body)}-byte data section")
        if end - begin != math.prod(shape) * dt.itemsize:
            raise CheckpointError(f"{path}: tensor {name!r} has {end - begin} bytes, its shape "
                                  f"{shape} and dtype {dt.name} need "
                                  f"{math.prod(shape) * dt.itemsize}")
        spans.append((begin, end))
        arr = np.frombuffer(body[begin:end], dtype=dt.numpy.newbyteorder("<"))
        tensors[name] = arr.astype(dt.numpy).reshape(shape)
    spans.sort()
    if any(a[1] > b[0] for a, b in itertools.pairwise(spans)):
        raise CheckpointError(f"{path}: corrupt: tensors overlap in the data section")
    return tensors, meta


def _check_version(meta: dict, path) -> int:
    version = _int(meta.get("format_version"), path)
    if version > FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: checkpoint format version {version} is newer than this OneModel reads "
            f"({FORMAT_VERSION}); upgrade onemodel-training"
        )
    if version >= 2 and _CHECKSUM not in meta:
        raise CheckpointError(f"{path}: corrupt: a version {version} checkpoint without its "
                              "checksum")
    return version


def _whole(v) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{v!r} is not a whole number")
    return v


def _verify(header: dict, meta: dict, body: memoryview, path) -> None:
    stored = meta.pop(_CHECKSUM)
    crc = zlib.crc32(body, zlib.crc32(_canonical(header)))
    meta[_CHECKSUM] = stored
    if stored != f"crc32:{crc:08x}":
        raise CheckpointError(f"{path}: corrupt: the checksum does not match (the file says "
                              f"{stored}, its contents give crc32:{crc:08x})")


__all__ = ["Checkpoint", "CheckpointError", "read_weights"]
