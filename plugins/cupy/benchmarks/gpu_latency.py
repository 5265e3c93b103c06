"""Session latency on the GPU against the CPU: a traced MLP and CNN and the light model-zoo
networks, each run by ``Session.load(path, device=...)`` on every device asked for, and by
onnxruntime (CPU, and CUDAExecutionProvider where onnxruntime-gpu is installed). Prints a table
of median latencies (end to end: feed to device, run, outputs back to host), the CPU/GPU ratio,
and the largest difference of each device's outputs from the CPU session's.

    python plugins/cupy/benchmarks/gpu_latency.py                     # cpu and cuda, every model
    python plugins/cupy/benchmarks/gpu_latency.py --devices cpu --tiny --zoo squeezenet
    python plugins/cupy/benchmarks/gpu_latency.py --zoo none --repeat 50

``scripts/gpu_check.sh`` runs it on a GPU machine.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from onemodel.runtime import Session
from onemodel.tensors import DType, Generator, Tensor, devices

ROOT = Path(__file__).resolve().parents[3]


def _zoo():
    path = ROOT / "integration-tests" / "onnx" / "zoo.py"
    spec = importlib.util.spec_from_file_location("_zoo", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def mlp(tiny: bool):
    from onemodel.training import Linear, ReLU, Sequential

    g = Generator(0)
    d, h, batch = (16, 32, 4) if tiny else (512, 2048, 64)
    return Sequential(Linear(d, h, g), ReLU(), Linear(h, h, g), ReLU(), Linear(h, 10, g)), (batch, d)


def cnn(tiny: bool):
    from onemodel.training import BatchNorm2d, Conv2d, Flatten, Linear, MaxPool2d, ReLU, Sequential

    g = Generator(1)
    c1, c2, hw, batch = (4, 8, 8, 2) if tiny else (32, 64, 32, 32)
    net = Sequential(Conv2d(3, c1, 3, padding=1, generator=g), BatchNorm2d(c1), ReLU(),
                     MaxPool2d(2), Conv2d(c1, c2, 3, padding=1, generator=g), BatchNorm2d(c2),
                     ReLU(), MaxPool2d(2), Flatten(), Linear(c2 * (hw // 4) ** 2, 10, g))
    return net.eval(), (batch, 3, hw, hw)


def traced_files(tiny: bool, work: Path):
    """(name, .onemodel path, .onnx path or None, feeds) of the traced MLP and CNN."""
    out = []
    for name, build in (("mlp", mlp), ("cnn", cnn)):
        model, shape = build(tiny)
        traced = model.trace(Tensor.zeros(DType.F32, *shape), "batch",
                             *([None] * (len(shape) - 1)))
        path = work / f"{name}.onemodel"
        traced.save(path)
        onnx_path = work / f"{name}.onnx"
        try:
            traced.save_onnx(onnx_path)
        except Exception:  # onemodel-onnx missing: no onnxruntime column for it
            onnx_path = None
        x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
        out.append((name, path, onnx_path, {"input": x}))
    return out


def zoo_files(names: list[str], work: Path):
    import onnx

    zoo = _zoo()
    avail = zoo.available()
    chosen = avail if names == ["all"] else [n for n in names if n in avail]
    out = []
    for name in chosen:
        model = zoo.randomized(zoo.load(name))
        path = work / f"{name}.onnx"
        onnx.save(model, str(path))
        key, x = zoo.data_input(model)
        out.append((name, path, path, {key: x}))
    return out


def register_standin() -> None:
    from onemodel.cupy import plugin
    from onemodel.tensors import registry
    from onemodel.tensors.registry import hookimpl

    class HostXp:
        @hookimpl
        def onemodel_register_backends(self, register):
            register("xp-host", description="onemodel-cupy's kernels on host arrays",
                     to_device="numpy:array", to_host="numpy:asarray", fallback=True)

        @hookimpl
        def onemodel_register_kernels(self, register):
            for op, (impl, dtypes) in plugin.KERNELS.items():
                register(op, impl, device="xp-host", dtypes=dtypes, priority=plugin.PRIORITY)

    registry.register_plugin(HostXp(), "xp-host")


def median_ms(fn, repeat: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def ort_session(path, provider: str):
    import onnxruntime as ort

    if provider not in ort.get_available_providers():
        return None
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), opts, providers=[provider])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--devices", default="cpu,cuda", help="comma-separated, cpu first")
    ap.add_argument("--zoo", default="all", help="'all', 'none' or comma-separated names")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--tiny", action="store_true", help="small traced models (a smoke test)")
    ap.add_argument("--no-ort", action="store_true", help="skip onnxruntime")
    ap.add_argument("--standin", action="store_true",
                    help="register device 'xp-host' (this plugin's kernels on host arrays), to "
                         "check the script without a GPU: --devices cpu,xp-host --standin")
    args = ap.parse_args(argv)
    if args.standin:
        register_standin()
    devs = [d.strip() for d in args.devices.split(",") if d.strip()]
    if devs[0] != "cpu":
        devs.insert(0, "cpu")
    for d in devs[1:]:
        try:
            devices.get_device(d)
        except devices.DeviceError as exc:
            print(f"device {d!r} is not usable here: {exc}", file=sys.stderr)
            return 2
    providers = []
    if not args.no_ort and importlib.util.find_spec("onnxruntime") is not None:
        import onnxruntime as ort

        providers = [p for p in ("CPUExecutionProvider", "CUDAExecutionProvider")
                     if p in ort.get_available_providers()]
    warnings.simplefilter("ignore", devices.DeviceFallbackWarning)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        models = traced_files(args.tiny, work)
        if args.zoo != "none":
            models += zoo_files(args.zoo.split(","), work)
        for name, path, onnx_path, feeds in models:
            row = {"model": name, "input": "x".join(map(str, next(iter(feeds.values())).shape))}
            ref = None
            for d in devs:
                session = Session.load(path, device=d)
                out = session.run(feeds, return_numpy=True)
                devices.reset_transfer_stats()
                row[d] = median_ms(lambda s=session, f=feeds: s.run(f, return_numpy=True),
                                   args.repeat)
                fallbacks = sum(v for k, v in devices.transfer_stats().items()
                                if k.startswith("fallback:"))
                got = next(iter(out.values()))
                if ref is None:
                    ref = got
                else:
                    row[f"{d} diff"] = float(np.abs(got - ref).max())
                    row[f"{d} fallbacks/run"] = fallbacks / (args.repeat + 2)
            for p in providers:
                sess = ort_session(onnx_path, p) if onnx_path is not None else None
                if sess is not None:
                    row[p] = median_ms(lambda s=sess, f=feeds: s.run(None, f), args.repeat)
            rows.append(row)
            print(f"  measured {name}", file=sys.stderr, flush=True)
    print_table(rows, devs, providers)
    return 0


def _fmt(v, digits=2) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}" if abs(v) >= 1e-2 or v == 0 else f"{v:.1e}"
    return str(v)


def print_table(rows, devs, providers) -> None:
    gpu = [d for d in devs if d != "cpu"]
    head = ["model", "input", "cpu ms"]
    for d in gpu:
        head += [f"{d} ms", f"cpu/{d}", f"{d} max|diff|", f"{d} fallbacks/run"]
    short = {"CPUExecutionProvider": "ort-cpu", "CUDAExecutionProvider": "ort-cuda"}
    for p in providers:
        head.append(f"{short[p]} ms")
    if "CUDAExecutionProvider" in providers:
        head += [f"ort-cuda/{d}" for d in gpu]
    table = [head]
    for r in rows:
        line = [r["model"], r["input"], _fmt(r["cpu"])]
        for d in gpu:
            line += [_fmt(r.get(d)), _fmt(r["cpu"] / r[d]) + "x", _fmt(r.get(f"{d} diff")),
                     _fmt(r.get(f"{d} fallbacks/run"), 1)]
        for p in providers:
            line.append(_fmt(r.get(p)))
        if "CUDAExecutionProvider" in providers:
            for d in gpu:
                t = r.get("CUDAExecutionProvider")
                line.append("-" if t is None else _fmt(t / r[d]) + "x")
        table.append(line)
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    for k, row in enumerate(table):
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |")
        if k == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")


if __name__ == "__main__":
    sys.exit(main())
