"""The plugin's kernel table driven through the core on a device, against the CPU: eager dispatch
of every op, traced models (an MLP and a CNN) in ``Session.load(path, device=...)``, the light
model-zoo networks, and a training loop.

Each test runs on two devices:

- ``"xp-host"``: this plugin's kernels registered for a device whose arrays are host numpy
  arrays. It runs everywhere and proves what does not need a GPU: that dispatch and the session
  call the kernels with the inputs, sizes and attributes they expect, that the traced models and
  training use no CPU fallback where the table claims the ops, and that results equal the CPU's.
- ``"cuda"``: the real device, CuPy on an NVIDIA GPU; skipped, with the reason, where CuPy or a
  GPU is missing (``scripts/gpu_check.sh`` runs it on a GPU machine).
"""

from __future__ import annotations

import importlib.util
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from onemodel.cupy import plugin
from onemodel.cupy._xp import DEVICE_DTYPES
from onemodel.runtime import Session
from onemodel.tensors import DType, Generator, OneModelError, Tensor, devices, registry
from onemodel.tensors.dispatch import dispatch
from onemodel.tensors.ops import OPS
from onemodel.tensors.registry import hookimpl

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CASES = _load("_cupy_kernel_cases", HERE / "test_kernels_numpy.py").CASES


def _gpu_reason() -> str | None:
    if importlib.util.find_spec("cupy") is None:
        return "CuPy is not installed (pip install 'onemodel-cupy[cuda12]' on a GPU machine)"
    from onemodel.cupy import device

    if not device.available():
        return "CuPy is installed but sees no CUDA device"
    return None


GPU_REASON = _gpu_reason()


class _HostXp:
    """The plugin's kernel table registered for device "xp-host", whose arrays are numpy's."""

    @hookimpl
    def onemodel_register_backends(self, register):
        register("xp-host", description="onemodel-cupy's kernels on host arrays (tests)",
                 to_device="numpy:array", to_host="numpy:asarray", fallback=True)

    @hookimpl
    def onemodel_register_kernels(self, register):
        for op, (impl, dtypes) in plugin.KERNELS.items():
            register(op, impl, device="xp-host", dtypes=dtypes, priority=plugin.PRIORITY)


@pytest.fixture(scope="module", params=["xp-host", "cuda"])
def device(request):
    if request.param == "cuda":
        if GPU_REASON:
            pytest.skip(GPU_REASON)
        yield "cuda"
        return
    registry.register_plugin(_HostXp(), "xp-host")
    try:
        yield "xp-host"
    finally:
        registry.unregister_plugin("xp-host")


def _tol(dtype):
    dtype = np.dtype(dtype)
    if dtype == np.float16:
        return 1e-2, 1e-2
    if dtype == np.float32:
        return 1e-4, 1e-5
    return 1e-10, 1e-12


def _fallbacks() -> dict[str, int]:
    return {k: v for k, v in devices.transfer_stats().items() if k.startswith("fallback:")}


# every op of the table through eager dispatch -------------------------------------------------

@pytest.mark.parametrize("op, inputs, attrs", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_op_on_the_device_matches_the_cpu(device, op, inputs, attrs):
    opdef = OPS[op]
    static = {i for i, n in enumerate(opdef.inputs) if n in opdef.static_inputs}
    on_device = [Tensor.from_numpy(a) if i in static else Tensor.from_numpy(a).to(device)
                 for i, a in enumerate(inputs)]
    if device == "cuda" and op == "Cast" and DType.of(attrs["to"]).numpy not in DEVICE_DTYPES:
        with pytest.raises(OneModelError, match="cannot be held by a CuPy array"):
            dispatch(op, on_device, attrs)
        return
    want = dispatch(op, [Tensor.from_numpy(a) for a in inputs], attrs)
    devices.reset_transfer_stats()
    got = dispatch(op, on_device, attrs)
    assert not _fallbacks(), f"{op} fell back to the CPU on {device}"
    wants = want if isinstance(want, tuple) else (want,)
    gots = got if isinstance(got, tuple) else (got,)
    for g, w in zip(gots, wants):
        assert g.device == device
        g, w = g.cpu().numpy(), w.numpy()
        assert g.shape == w.shape and g.dtype == w.dtype
        if w.dtype.kind == "f":
            rtol, atol = _tol(w.dtype)
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol * max(1.0, np.nanmax(
                np.abs(np.where(np.isfinite(w), w, 0)), initial=0)), equal_nan=True)
        else:
            np.testing.assert_array_equal(g, w)


# traced models in sessions --------------------------------------------------------------------

def _mlp():
    from onemodel.training import Linear, ReLU, Sequential

    g = Generator(0)
    return Sequential(Linear(12, 32, g), ReLU(), Linear(32, 32, g), ReLU(), Linear(32, 5, g))


def _cnn():
    from onemodel.training import BatchNorm2d, Conv2d, Flatten, Linear, MaxPool2d, ReLU, Sequential

    g = Generator(1)
    net = Sequential(Conv2d(3, 8, 3, padding=1, generator=g), BatchNorm2d(8), ReLU(),
                     MaxPool2d(2), Conv2d(8, 8, 3, padding=1, groups=2, generator=g),
                     BatchNorm2d(8), ReLU(), MaxPool2d(2), Flatten(), Linear(8 * 2 * 2, 4, g))
    for i, bn in ((1, net[1]), (5, net[5])):
        bn.running_mean.numpy()[:] = Generator(i).normal((8,), 0, 0.1)
        bn.running_var.numpy()[:] = Generator(i + 1).uniform((8,), 0.5, 1.5)
    return net.eval()


@pytest.mark.parametrize("build, shape", [(_mlp, (7, 12)), (_cnn, (3, 3, 8, 8))],
                         ids=["mlp", "cnn"])
def test_traced_model_in_a_device_session_matches_the_cpu(device, build, shape, tmp_path):
    model = build()
    traced = model.trace(Tensor.zeros(DType.F32, 2, *shape[1:]), "batch", *([None] * (len(shape) - 1)))
    path = tmp_path / "model.onemodel"
    traced.save(path)
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    want = Session.load(path).run({"input": x}, return_numpy=True)
    session = Session.load(path, device=device)
    session.run({"input": x})
    devices.reset_transfer_stats()
    got = session.run({"input": x}, return_numpy=True)
    assert not _fallbacks(), f"ops fell back to the CPU: {_fallbacks()}"
    for name, w in want.items():
        np.testing.assert_allclose(got[name], w, rtol=1e-4, atol=1e-5)


def _zoo():
    path = ROOT / "integration-tests" / "onnx" / "zoo.py"
    if importlib.util.find_spec("onnx") is None or importlib.util.find_spec("onemodel.onnx") is None \
            or not path.exists():
        return None
    return _load("_cupy_zoo", path)


ZOO = _zoo()
# on the host stand-in, two small networks prove the path; on the GPU, all of them
HOST_ZOO = ("squeezenet", "shufflenet")
ZOO_NETS = ZOO.available() if ZOO is not None else []


@pytest.mark.slow
@pytest.mark.skipif(ZOO is None, reason="the model zoo needs onnx and onemodel-onnx")
@pytest.mark.parametrize("name", ZOO_NETS)
def test_light_zoo_network_on_the_device_matches_the_cpu(device, name, tmp_path):
    if device != "cuda" and name not in HOST_ZOO:
        pytest.skip("on the host stand-in only " + ", ".join(HOST_ZOO) + " run (time)")
    import onnx

    model = ZOO.randomized(ZOO.load(name))
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, str(path))
    feed_name, x = ZOO.data_input(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", devices.DeviceFallbackWarning)
        want = next(iter(Session.load(path).run({feed_name: x}, return_numpy=True).values()))
        got = next(iter(Session.load(path, device=device).run({feed_name: x},
                                                              return_numpy=True).values()))
    scale = float(np.abs(want).max()) or 1.0
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4 * scale)


# training ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("opt", ["SGD", "Adam"])
def test_training_on_the_device_equals_training_on_the_cpu(device, opt):
    from onemodel import training as T
    from onemodel.training import losses

    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 12)).astype(np.float32)
    y = rng.integers(0, 5, 16)
    results = {}
    for dev in ("cpu", device):
        model = _mlp().to(dev)
        optimizer = (T.SGD(model.parameters(), 0.1, momentum=0.9) if opt == "SGD"
                     else T.Adam(model.parameters(), 0.01))
        trace = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", devices.DeviceFallbackWarning)
            for _ in range(5):
                optimizer.zero_grad()
                loss = losses.cross_entropy(model(Tensor(x, device=dev)), Tensor(y, device=dev))
                loss.backward()
                optimizer.step()
                trace.append(loss.item())
        results[dev] = (trace, {k: v.cpu().numpy() for k, v in model.state_dict().items()})
    np.testing.assert_allclose(results[device][0], results["cpu"][0], rtol=1e-5)
    for k, v in results["cpu"][1].items():
        np.testing.assert_allclose(results[device][1][k], v, rtol=1e-4, atol=1e-6)


def test_a_cnn_training_step_on_the_device_equals_the_cpu(device):
    from onemodel import training as T
    from onemodel.training import losses

    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 3, 8, 8)).astype(np.float32)
    y = rng.integers(0, 4, 4)
    grads = {}
    for dev in ("cpu", device):
        model = _cnn().train().to(dev)
        optimizer = T.SGD(model.parameters(), 0.05)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", devices.DeviceFallbackWarning)
            for _ in range(2):
                optimizer.zero_grad()
                losses.cross_entropy(model(Tensor(x, device=dev)), Tensor(y, device=dev)).backward()
                optimizer.step()
        grads[dev] = {k: v.cpu().numpy() for k, v in model.state_dict().items()}
    for k, v in grads["cpu"].items():
        np.testing.assert_allclose(grads[device][k], v, rtol=1e-4, atol=1e-5, err_msg=k)


if __name__ == "__main__":  # pragma: no cover - python test_devices.py: the GPU part only
    sys.exit(pytest.main([__file__, "-k", "cuda", "-q"]))
