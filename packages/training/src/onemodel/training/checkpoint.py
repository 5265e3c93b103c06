"""``Checkpoint``: model (and optimizer) state in a safetensors-layout file that never runs code.

Layout (readable by any safetensors reader): 8-byte little-endian header length, a JSON header
mapping tensor names to dtype, shape and byte offsets plus a ``__metadata__`` table of strings,
then the tensor bytes. OneModel's metadata: ``format`` = ``onemodel-checkpoint``,
``format_version``, the model class, parameter names, and the optimizer's class, hyperparameters
and scalar state as JSON. Tensors are named ``model/<state-dict key>`` and
``optimizer/<parameter index>/<state name>``.

Writing goes to a temporary file in the same folder, then replaces the target atomically.
Loading checks every length and offset against the file before allocating, checks that the
file fits the model and optimizer, and only then copies values in: a failed load changes nothing.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np

from onemodel.tensors import DType, OneModelError
from onemodel.tensors.fileio import atomic_write

from .module import Module
from .optim.optimizer import Optimizer

FORMAT = "onemodel-checkpoint"
FORMAT_VERSION = 1
_MAX_HEADER = 64 * 1024 * 1024


class CheckpointError(OneModelError):
    """A checkpoint file is corrupt, truncated, too new, or of another model."""


class Checkpoint:
    """Save and load a model's parameters and buffers, and optionally an optimizer's state."""

    @staticmethod
    def save(path: str | os.PathLike, model: Module, optimizer: Optimizer | None = None) -> None:
        tensors: dict[str, np.ndarray] = {}
        for name, t in model.state_dict().items():
            tensors[f"model/{name}"] = _contiguous(t.numpy())
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
        version = _int(meta.get("format_version"), path)
        if version > FORMAT_VERSION:
            raise CheckpointError(
                f"{path}: checkpoint format version {version} is newer than this OneModel reads "
                f"({FORMAT_VERSION}); upgrade onemodel-training"
            )
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
            optimizer._check_state_dict(opt_state)
        for target, arr in plan:
            target._data[...] = arr
        if opt_state is not None:
            optimizer.load_state_dict(opt_state)
        return meta


def _optimizer_state(tensors, meta, path) -> dict:
    try:
        groups = json.loads(meta["optimizer_groups"])
        scalars = json.loads(meta.get("optimizer_scalars", "{}"))
    except (json.JSONDecodeError, KeyError) as exc:
        raise CheckpointError(f"{path}: corrupt optimizer metadata ({exc})") from None
    state: dict[int, dict[str, Any]] = {}
    for k, v in tensors.items():
        if k.startswith("optimizer/"):
            _, idx, name = k.split("/", 2)
            state.setdefault(int(idx), {})[name] = v
    for idx, entries in scalars.items():
        state.setdefault(int(idx), {}).update(entries)
    for g in groups:
        if "betas" in g:
            g["betas"] = tuple(g["betas"])
    return {"state": state, "param_groups": groups}


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
    header: dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    for name, arr in tensors.items():
        dt = DType.from_numpy(arr.dtype)
        header[name] = {"dtype": dt.name, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + arr.nbytes]}
        offset += arr.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-(len(raw) + 8) % 8)  # data starts 8-byte aligned
    def chunks():
        yield struct.pack("<Q", len(raw))
        yield raw
        for arr in tensors.values():
            yield arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()

    atomic_write(path, chunks())


def read_safetensors(path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Read and validate a safetensors-layout file; every size is checked before use."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such checkpoint file") from None
    if len(data) < 8:
        raise CheckpointError(f"{path}: truncated (only {len(data)} bytes)")
    (n,) = struct.unpack("<Q", data[:8])
    if n > _MAX_HEADER or 8 + n > len(data):
        raise CheckpointError(f"{path}: corrupt or truncated header (claims {n} bytes, file has "
                              f"{len(data) - 8})")
    try:
        header = json.loads(data[8 : 8 + n])
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: corrupt header ({exc.__class__.__name__})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: corrupt header (not a table)")
    meta = header.pop("__metadata__", {}) or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise CheckpointError(f"{path}: corrupt metadata")
    body = memoryview(data)[8 + n :]
    tensors: dict[str, np.ndarray] = {}
    spans = []
    for name, info in header.items():
        try:
            dt = DType[info["dtype"]]
            shape = [int(d) for d in info["shape"]]
            begin, end = (int(v) for v in info["data_offsets"])
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


__all__ = ["Checkpoint", "CheckpointError"]
