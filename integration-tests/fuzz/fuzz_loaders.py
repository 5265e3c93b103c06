"""Seeded fuzzing of the three loaders (.onemodel, .onnx, checkpoints), run as a child process.

Each case mutates a good file (truncation, byte flips, inserted and deleted bytes, and
structure-aware mutations of the JSON header or of the protobuf, with checksums fixed up so the
mutation reaches the decoder, and crafted huge shapes), loads it, and classifies the outcome:

- ``clean``: it loaded;
- ``error``: a ``OneModelError``;
- anything else (another exception type, ``MemoryError`` under the address-space limit, a case
  slower than the per-case limit) is a failure, reported with the case's seed and mutation.

Run as a program it prints one JSON summary on stdout::

    python integration-tests/fuzz/fuzz_loaders.py --format onnx --seed 1 --cases 300 \\
        --memory-mb 1536 --case-seconds 5

The limit on memory is ``resource.setrlimit(RLIMIT_AS)``, set before the first case.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import resource
import struct
import sys
import tempfile
import time
import traceback
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = [None, True, False, -1, 0, 1, 2**31, 2**62, 2**63 - 1, -(2**63), 1.5, 1e308,
           float("inf"), float("-inf"), float("nan"), "", "x" * 5000, "batch // 0",
           "(" * 40 + "b" + ")" * 40, "\u00b2", "9" * 300 + " * 1.5 > 0", "batch // 0 > 1",
           "1 < 2 < 3", "nope > 1", [], {}, [[[[[]]]]], [40000, 40000],
           [2**40, 2**40], {"i": 1}, {"none": True}, "F32", "I64", "Relu"]
HUGE_SHAPES = [[40000, 40000], [2**31, 2**31], [0, 2**62], [2**20, 2**20, 2**20], [-1, 5],
               [1, 1 << 40]]


# good files ------------------------------------------------------------------------------------

def _graph():
    sys.path.insert(0, str(ROOT / "packages" / "runtime" / "tests"))
    from runtime_graphs import conv_net

    from onemodel.runtime.graph import Guard

    g = conv_net()
    g.guards = [Guard("batch * 2 >= 2", "batch", "fuzz_loaders.py:1"),
                Guard("batch % 1 == 0", "batch", "fuzz_loaders.py:2")]
    return g


def good_native(folder: Path) -> bytes:
    from onemodel.runtime import save

    save(_graph(), folder / "good.onemodel")
    return (folder / "good.onemodel").read_bytes()


def good_onnx(folder: Path) -> bytes:
    from onemodel.onnx.export import save

    save(_graph(), folder / "good.onnx")
    return (folder / "good.onnx").read_bytes()


def _training_model():
    from onemodel.tensors import Generator
    from onemodel.training import BatchNorm1d, Linear, ReLU, Sequential

    return Sequential(Linear(4, 8, Generator(0)), BatchNorm1d(8), ReLU(),
                      Linear(8, 3, Generator(1)))


def good_checkpoint(folder: Path) -> bytes:
    from onemodel.tensors import Generator, Tensor
    from onemodel.training import Adam, Checkpoint

    model = _training_model()
    opt = Adam(model.parameters(), 0.01, amsgrad=True)
    opt.zero_grad()
    (model(Tensor.randn(5, 4, generator=Generator(2))) ** 2).mean().backward()
    opt.step()
    Checkpoint.save(folder / "good.checkpoint", model, opt)
    return (folder / "good.checkpoint").read_bytes()


# byte-level mutations -------------------------------------------------------------------------

def mutate_bytes(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    b = bytearray(data)
    kind = rng.choice(["truncate", "flip", "flips", "insert", "delete", "fill"])
    if kind == "truncate":
        cut = rng.randrange(len(b))
        return bytes(b[:cut]), f"truncate at {cut}"
    if kind == "flip":
        pos = rng.randrange(len(b))
        b[pos] ^= 1 << rng.randrange(8)
        return bytes(b), f"flip a bit at {pos}"
    if kind == "flips":
        for _ in range(rng.randint(2, 16)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        return bytes(b), "random bytes"
    if kind == "insert":
        pos = rng.randrange(len(b))
        b[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
        return bytes(b), f"insert at {pos}"
    if kind == "delete":
        pos = rng.randrange(len(b))
        del b[pos : pos + rng.randint(1, 64)]
        return bytes(b), f"delete at {pos}"
    pos = rng.randrange(len(b))
    n = rng.randint(1, 256)
    b[pos : pos + n] = bytes([rng.choice([0, 0xFF, 0x7F, 0x80])]) * len(b[pos : pos + n])
    return bytes(b), f"fill at {pos}"


# JSON-tree mutations (.onemodel headers, checkpoint headers and optimizer metadata) -----------

def _slots(tree, path=()):
    """Every (container, key) in a JSON tree, with its path."""
    out = []
    if isinstance(tree, dict):
        for k in list(tree):
            out.append((tree, k, (*path, k)))
            out += _slots(tree[k], (*path, k))
    elif isinstance(tree, list):
        for i in range(len(tree)):
            out.append((tree, i, (*path, i)))
            out += _slots(tree[i], (*path, i))
    return out


def mutate_tree(tree, rng: random.Random) -> str:
    slots = _slots(tree)
    if not slots:
        return "nothing to mutate"
    container, key, path = rng.choice(slots)
    kind = rng.choice(["replace", "replace", "replace", "delete", "duplicate", "swap", "shape"])
    where = "/".join(map(str, path))[:120]
    if kind == "replace":
        container[key] = copy.deepcopy(rng.choice(HOSTILE))
        return f"replace {where} with {str(container[key])[:40]}"
    if kind == "delete":
        del container[key]
        return f"delete {where}"
    if kind == "duplicate" and isinstance(container, list):
        container.insert(key, copy.deepcopy(container[key]))
        return f"duplicate {where}"
    if kind == "swap":
        other, okey, opath = rng.choice(slots)
        try:
            container[key], other[okey] = other[okey], container[key]
        except (KeyError, IndexError):
            return "swap skipped"
        return f"swap {where} and {'/'.join(map(str, opath))[:120]}"
    shapes = [(c, k) for c, k, _ in slots if k == "shape"]
    if shapes:
        c, k = rng.choice(shapes)
        c[k] = list(rng.choice(HUGE_SHAPES))
        return f"huge shape {c[k]}"
    return "no shape to grow"


def _native_file(header: dict, data: bytes) -> bytes:
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-(40 + len(raw)) % 64)
    return struct.pack("<8sIIQQII", b"ONEMODEL", 1, 0, len(raw), len(data), zlib.crc32(raw),
                       zlib.crc32(data)) + raw + data


def mutate_native(good: bytes, rng: random.Random) -> tuple[bytes, str]:
    if rng.random() < 0.4:
        return mutate_bytes(good, rng)
    hlen, _ = struct.unpack("<QQ", good[16:32])
    header, data = json.loads(good[40 : 40 + hlen]), good[40 + hlen :]
    roll = rng.random()
    if roll < 0.05:
        return _native_file({"nodes": [[[]]]}, data).replace(
            b"[[[]]]", b"[" * 100_000 + b"]" * 100_000), "nesting 100,000 deep"
    if roll < 0.1:
        header["nodes"] = header["nodes"] * rng.choice([10, 100])
        return _native_file(header, data), "repeated nodes"
    what = "; ".join(mutate_tree(header, rng) for _ in range(rng.randint(1, 3)))
    return _native_file(header, data), what


def _checkpoint_file(header: dict, data: bytes) -> bytes:
    meta = header.get("__metadata__")
    if isinstance(meta, dict) and "checksum" in meta:  # re-checksum as a hostile writer would
        meta.pop("checksum")
        crc = zlib.crc32(data, zlib.crc32(json.dumps(header, separators=(",", ":")).encode()))
        meta["checksum"] = f"crc32:{crc:08x}"
    raw = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(raw)) + raw + data


def mutate_checkpoint(good: bytes, rng: random.Random) -> tuple[bytes, str]:
    if rng.random() < 0.4:
        return mutate_bytes(good, rng)
    (n,) = struct.unpack("<Q", good[:8])
    header, data = json.loads(good[8 : 8 + n]), good[8 + n :]
    if rng.random() < 0.4:  # inside the optimizer's JSON strings
        key = rng.choice(["optimizer_groups", "optimizer_scalars"])
        inner = json.loads(header["__metadata__"][key])
        what = mutate_tree(inner, rng) if rng.random() < 0.8 else "replaced by garbage"
        header["__metadata__"][key] = (json.dumps(inner) if what != "replaced by garbage"
                                       else rng.choice(["", "[", "{}", "Infinity", "[" * 5000]))
        return _checkpoint_file(header, data), f"{key}: {what}"
    what = "; ".join(mutate_tree(header, rng) for _ in range(rng.randint(1, 3)))
    return _checkpoint_file(header, data), what


# protobuf mutations (.onnx) --------------------------------------------------------------------

def mutate_onnx(good: bytes, rng: random.Random) -> tuple[bytes, str]:
    import onnx
    from onnx import helper

    if rng.random() < 0.3:
        return mutate_bytes(good, rng)
    m = onnx.load_from_string(good)
    g = m.graph
    if rng.random() < 0.5:  # let weight mutations reach decoding instead of the checksum
        keep = [p for p in m.metadata_props if p.key != "onemodel.initializers_crc32"]
        del m.metadata_props[:]
        m.metadata_props.extend(keep)
    kinds = ["dims", "dtype", "raw", "op", "drop input", "empty input", "attr", "drop attr",
             "dim", "opset", "constant of shape", "constant", "no graph", "no outputs",
             "repeat nodes", "checksum", "guards"]
    kind = rng.choice(kinds)
    if kind == "dims" and g.initializer:
        t = rng.choice(g.initializer)
        t.ClearField("dims")
        t.dims.extend(rng.choice(HUGE_SHAPES + [[0], [3, 3]]))
    elif kind == "dtype" and g.initializer:
        rng.choice(g.initializer).data_type = rng.randrange(0, 26)
    elif kind == "raw" and g.initializer:
        t = rng.choice(g.initializer)
        t.raw_data = t.raw_data[: rng.randrange(len(t.raw_data) + 1)]
    elif kind == "op":
        from onemodel.tensors.ops import OPS

        rng.choice(g.node).op_type = rng.choice([*sorted(OPS), "Loop", "If", "Upsample", "Foo",
                                                 "ConstantOfShape", "Constant"])
    elif kind == "drop input":
        node = rng.choice(g.node)
        if node.input:
            del node.input[rng.randrange(len(node.input))]
    elif kind == "empty input":
        node = rng.choice(g.node)
        if node.input:
            node.input[rng.randrange(len(node.input))] = ""
    elif kind == "attr":
        node = rng.choice(g.node)
        name = rng.choice(["axis", "to", "perm", "kernel_shape", "pads", "value", "axes",
                           "starts", "mode", "alpha", "strides"])
        value = rng.choice([-(2**62), 2**62, 7, 1.5, float("nan"), [0, -9, 2**40], b"\xff",
                            "text", [1.5, 2.5], helper.make_tensor("t", 1, [1], [1.0])])
        del node.attribute[:]
        node.attribute.append(helper.make_attribute(name, value))
    elif kind == "drop attr":
        node = rng.choice(g.node)
        del node.attribute[:]
    elif kind == "dim":
        v = rng.choice([*g.input, *g.output])
        dims = v.type.tensor_type.shape.dim
        if dims:
            d = dims[rng.randrange(len(dims))]
            if rng.random() < 0.5:
                d.dim_value = rng.choice([-5, 0, 2**62, 40000])
            else:
                d.dim_param = rng.choice(["b // 0", "(" * 5000, "9" * 5000, "", " ", "a b"])
    elif kind == "opset":
        m.opset_import[0].version = rng.randrange(0, 30)
    elif kind == "constant of shape":
        shape = helper.make_tensor("cos_shape", onnx.TensorProto.INT64, [2],
                                   rng.choice(HUGE_SHAPES)[:2])
        g.initializer.append(shape)
        g.node.insert(0, helper.make_node("ConstantOfShape", ["cos_shape"], ["cos_out"]))
        g.output.append(helper.make_tensor_value_info("cos_out", 1, None))
    elif kind == "constant":
        attrs = rng.choice([{}, {"value_float": 1.0, "value_int": 1}, {"value_string": "x"}])
        node = helper.make_node("Constant", [], ["const_out"])
        for k, v in attrs.items():
            node.attribute.append(helper.make_attribute(k, v))
        g.node.insert(0, node)
    elif kind == "no graph":
        m.ClearField("graph")
    elif kind == "no outputs":
        del g.output[:]
    elif kind == "repeat nodes":
        extra = [copy.deepcopy(n) for n in g.node] * 20
        g.node.extend(extra)
    elif kind == "guards":
        entry = next((p for p in m.metadata_props if p.key == "onemodel.guards"), None)
        if entry is not None:
            guards = json.loads(entry.value)
            if rng.random() < 0.7:
                kind += ": " + mutate_tree(guards, rng)
                entry.value = json.dumps(guards)
            else:
                entry.value = rng.choice(["", "[", "{}", "Infinity", "[" * 5000, "[1e400]",
                                          '[{"condition": "' + "9" * 300 + ' * 1.5 > 0", '
                                          '"axis": "b", "location": "x"}]'])
    elif kind == "checksum":
        m.metadata_props.add(key="onemodel.initializers_crc32", value="00000000")
    data = m.SerializeToString()
    if rng.random() < 0.2:
        data, more = mutate_bytes(data, rng)
        kind += f" + {more}"
    return data, kind


# running ---------------------------------------------------------------------------------------

FORMATS = {
    "native": (".onemodel", good_native, mutate_native),
    "onnx": (".onnx", good_onnx, mutate_onnx),
    "checkpoint": (".checkpoint", good_checkpoint, mutate_checkpoint),
}


def _loader(fmt: str):
    if fmt == "checkpoint":
        from onemodel.training import Adam, Checkpoint

        def load(path):
            model = _training_model()
            Checkpoint.load(path, model, Adam(model.parameters()))
        return load
    from onemodel.runtime import load

    return load


def run(fmt: str, seed: int, cases: int, case_seconds: float) -> dict:
    from onemodel.tensors import OneModelError

    suffix, make_good, mutate = FORMATS[fmt]
    counts = {"cases": 0, "clean": 0, "error": 0, "failed": 0}
    failures = []
    slowest = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        good = make_good(folder)
        load = _loader(fmt)
        path = folder / f"case{suffix}"
        for i in range(cases):
            rng = random.Random(seed * 1_000_003 + i)
            data, what = mutate(good, rng)
            path.write_bytes(data)
            start = time.perf_counter()
            try:
                load(path)
                outcome = "clean"
            except OneModelError:
                outcome = "error"
            except BaseException as exc:  # every other outcome is the finding
                outcome = "failed"
                tb = traceback.extract_tb(exc.__traceback__)[-3:]
                failures.append({"case": i, "mutation": what[:200],
                                 "exception": f"{type(exc).__name__}: {str(exc)[:300]}",
                                 "where": [f"{f.filename}:{f.lineno}" for f in tb]})
            elapsed = time.perf_counter() - start
            slowest = max(slowest, elapsed)
            if elapsed > case_seconds and outcome != "failed":
                outcome = "failed"
                failures.append({"case": i, "mutation": what[:200],
                                 "exception": f"took {elapsed:.1f} s (limit {case_seconds} s)"})
            counts["cases"] += 1
            counts[outcome] += 1
    return {"format": fmt, "seed": seed, **counts, "slowest_s": round(slowest, 3),
            "max_rss_mb": _peak_rss_mb(),
            "failures": failures[:20]}


def _peak_rss_mb() -> int:
    """VmHWM: ru_maxrss would carry over the parent's peak across fork and exec."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM"):
                return int(line.split()[1]) // 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--format", choices=sorted(FORMATS), required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cases", type=int, default=200)
    p.add_argument("--memory-mb", type=int, default=1536)
    p.add_argument("--case-seconds", type=float, default=5.0)
    args = p.parse_args(argv)
    limit = args.memory_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    print(json.dumps(run(args.format, args.seed, args.cases, args.case_seconds)))


if __name__ == "__main__":
    main()
