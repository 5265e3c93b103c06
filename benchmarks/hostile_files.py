"""Time and peak memory of loading hostile files, each load in a fresh process (median of runs).

The files are the ones issue 9 measured: a .onemodel whose header claims 255 MiB, a 64-byte ONNX
file whose ConstantOfShape asks for 40000 x 40000 floats, chains of 250,000, 300,001 and 10^6
Relu nodes as .onemodel and 10^6 as ONNX. A check, not a timing: it prints what each load did.

    python benchmarks/hostile_files.py [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import struct
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

# peak RSS from VmHWM: ru_maxrss would carry the parent's peak over fork and exec
CHILD = """
import sys, time
from onemodel.runtime import load
start = time.perf_counter()
try:
    load(sys.argv[1])
    out = "loaded"
except Exception as exc:
    out = f"{type(exc).__name__}: {str(exc).split(': ', 1)[-1][:90]}"
hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM"))
print(time.perf_counter() - start, int(hwm.split()[1]) // 1024, out)
"""


def _native(raw: bytes) -> bytes:
    raw += b" " * (-(40 + len(raw)) % 64)
    return struct.pack("<8sIIQQII", b"ONEMODEL", 1, 0, len(raw), 0, zlib.crc32(raw),
                       zlib.crc32(b"")) + raw


def relu_chain(n: int) -> bytes:
    nodes = ",".join(f'{{"op":"Relu","name":"r{i}","inputs":["v{i}"],"outputs":["v{i + 1}"],'
                     f'"attrs":{{}}}}' for i in range(n))
    return _native((f'{{"name":"chain","metadata":{{}},"inputs":[{{"name":"v0","dtype":"F32",'
                    f'"shape":["batch",3]}}],"outputs":[{{"name":"v{n}","dtype":"F32","shape":'
                    f'["batch",3]}}],"nodes":[{nodes}],"initializers":[]}}').encode())


def make(folder: Path) -> list[Path]:
    import onnx
    from onnx import helper

    files = {}
    hlen = 255 * 2**20
    raw = b"{}" + b" " * (hlen - 2)
    files["header_255MiB.onemodel"] = struct.pack("<8sIIQQII", b"ONEMODEL", 1, 0, hlen, 0,
                                                  zlib.crc32(raw), 0) + raw
    cos = helper.make_model(helper.make_graph(
        [helper.make_node("ConstantOfShape", ["s"], ["y"])], "g", [],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [helper.make_tensor("s", onnx.TensorProto.INT64, [2], [40000, 40000])]))
    files["constant_of_shape.onnx"] = cos.SerializeToString()
    for n in (250_000, 300_001, 1_000_000):
        files[f"relu_chain_{n}.onemodel"] = relu_chain(n)
    nodes = [helper.make_node("Relu", [f"v{i}"], [f"v{i + 1}"]) for i in range(1_000_000)]
    chain = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("v0", 1, [2])],
                              [helper.make_tensor_value_info("v1000000", 1, [2])])
    files["relu_chain_1000000.onnx"] = helper.make_model(chain).SerializeToString()
    paths = []
    for name, data in files.items():
        (folder / name).write_bytes(data)
        paths.append(folder / name)
    return paths


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print("| file | bytes | load time (median) | peak RSS (median) | outcome |")
        print("|---|---|---|---|---|")
        for path in make(Path(tmp)):
            runs = [subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True,
                                   text=True, check=True).stdout.split(maxsplit=2)
                    for _ in range(args.runs)]
            secs = statistics.median(float(r[0]) for r in runs)
            rss = statistics.median(int(r[1]) for r in runs)
            print(f"| {path.name} | {path.stat().st_size:,} | {secs:.2f} s | {rss:.0f} MB | "
                  f"{runs[0][2].strip()} |")


if __name__ == "__main__":
    main()
