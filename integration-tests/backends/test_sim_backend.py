"""A third-party backend, installed like any plugin: ``onemodel-sim-backend`` registers device
"sim" (host arrays held in a wrapper type that refuses to mix with host arrays) with kernels for
some ops, and "sim-strict", which refuses the CPU fallback. Everything a backend author relies on
is checked against the CPU: placement of tensors, modules and sessions, kernel choice by
priority, fallback with counted transfers, autograd and training, checkpoints, tracing, and the
operator's controls over plugins (deny list, a plugin that fails to import)."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

pytest.importorskip("onemodel_sim", reason="the example backend: pip install "
                    "integration-tests/backends/sim (scripts/dev.py installs it)")

from onemodel_sim import kernels as sim_kernels
from onemodel_sim.arrays import SimArray

from onemodel import training as T
from onemodel.runtime import Session
from onemodel.tensors import OneModelError, Tensor, devices
from onemodel.training import losses

pytestmark = pytest.mark.filterwarnings("ignore::onemodel.tensors.devices.DeviceFallbackWarning")


def _data(seed=0, n=16):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 6)).astype(np.float32), rng.integers(0, 3, n)


def _model(seed=0):
    T_seed = np.random.default_rng(seed)
    m = T.Sequential(T.Linear(6, 12), T.ReLU(), T.Linear(12, 3))
    for p in m.parameters():
        p._data[...] = T_seed.standard_normal(p.shape).astype(np.float32) * 0.3
    return m


# placement ----------------------------------------------------------------------------------

def test_tensors_live_on_the_device_in_its_own_array_type():
    x = Tensor([[1.0, -2.0], [3.0, 4.0]], device="sim")
    assert x.device == "sim" and isinstance(x._data, SimArray)
    y = x * 2 + 1
    assert y.device == "sim" and isinstance(y._data, SimArray)
    np.testing.assert_array_equal(y.cpu().numpy(), [[3.0, -3.0], [7.0, 9.0]])
    back = x.to("cpu")
    assert back.device == "cpu" and isinstance(back.numpy(), np.ndarray)
    assert Tensor.zeros(2, 3, device="sim").device == "sim"
    assert Tensor.arange(4, device="sim").cpu().numpy().tolist() == [0, 1, 2, 3]


def test_a_host_read_of_device_data_must_be_explicit():
    x = Tensor([1.0, 2.0], device="sim")
    with pytest.raises(devices.DeviceError, match=r"\.cpu\(\)"):
        x.numpy()
    with pytest.raises(OneModelError, match="cpu"):
        np.asarray(x)
    assert x.tolist() == [1.0, 2.0] and x.sum().item() == 3.0  # reads that copy, as in torch


def test_ops_on_tensors_of_two_devices_are_refused_naming_both():
    with pytest.raises(devices.DeviceError, match=r"MatMul.*'sim'.*'cpu'"):
        Tensor(np.ones((2, 2), np.float32), device="sim") @ Tensor(np.ones((2, 2), np.float32))
    # a Python scalar (a 0-d host tensor) goes with any device, as CPU scalars do in PyTorch
    assert (Tensor([1.0], device="sim") + 1.5).device == "sim"


def test_an_unknown_device_is_an_error_that_names_the_installed_ones():
    with pytest.raises(devices.DeviceError, match=r"'nowhere'.*cpu.*sim"):
        Tensor([1.0], device="nowhere")
    with pytest.raises(devices.DeviceError, match=r"'cuda'.*(onemodel-cupy|not usable)"):
        Tensor([1.0]).to("cuda")


# kernel choice and fallback ---------------------------------------------------------------

def test_the_highest_priority_kernel_that_supports_the_call_runs():
    sim_kernels.calls.clear()
    Tensor(np.array([-1.0, 2.0], np.float32), device="sim").relu()
    assert sim_kernels.calls["Relu:fast"] == 1 and sim_kernels.calls["Relu"] == 0
    out = Tensor(np.array([-1.0, 2.0]), device="sim").relu()  # F64: the fast kernel refuses
    assert sim_kernels.calls["Relu"] == 1
    np.testing.assert_array_equal(out.cpu().numpy(), [0.0, 2.0])


def test_an_op_without_a_device_kernel_runs_on_the_cpu_with_counted_transfers():
    x = np.random.default_rng(1).standard_normal((3, 5)).astype(np.float32)
    devices.reset_transfer_stats()
    dev = devices.get_device("sim")
    dev.warned.discard("Softmax")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = Tensor(x, device="sim").softmax(-1)
        Tensor(x, device="sim").softmax(-1)
    said = [w for w in caught if issubclass(w.category, devices.DeviceFallbackWarning)]
    assert len(said) == 1 and "Softmax" in str(said[0].message)  # once per op
    stats = devices.transfer_stats()
    assert stats["fallback:Softmax"] == 2
    assert stats["to_host"] == 2 and stats["to_device"] == 4  # 2 feeds + 2 results
    assert out.device == "sim"
    np.testing.assert_allclose(out.cpu().numpy(), Tensor(x).softmax(-1).numpy(), rtol=1e-6)


def test_a_call_every_device_kernel_refuses_runs_on_the_cpu():
    sim_kernels.calls.clear()
    devices.reset_transfer_stats()
    f32 = Tensor(np.array([-1.5, 2.0], np.float32), device="sim").abs()
    f64 = Tensor(np.array([-1.5, 2.0]), device="sim").abs()  # abs_f32's supports refuses F64
    assert sim_kernels.calls["Abs:f32"] == 1
    assert devices.transfer_stats()["fallback:Abs"] == 1
    assert f64.device == "sim" and f64.cpu().numpy().tolist() == [1.5, 2.0]
    assert f32.cpu().numpy().tolist() == [1.5, 2.0]


def test_a_backend_that_refuses_fallback_names_the_op_and_device():
    x = Tensor(np.ones((2, 3), np.float32), device="sim-strict")
    assert (x + x).device == "sim-strict"  # it has Add
    with pytest.raises(devices.DeviceError, match=r"Softmax.*'sim-strict'"):
        x.softmax(-1)


# autograd, modules, training ---------------------------------------------------------------

def test_gradients_on_the_device_equal_the_cpu_ones():
    x = np.random.default_rng(2).standard_normal((4, 6)).astype(np.float32)
    grads = {}
    for device in ("cpu", "sim"):
        t = Tensor(x, device=device, requires_grad=True)
        loss = ((t @ t.transpose(0, 1)).tanh().softmax(-1) * 3).sum()
        loss.backward()
        assert t.grad.device == device
        grads[device] = t.grad.cpu().numpy()
    np.testing.assert_allclose(grads["sim"], grads["cpu"], rtol=1e-5, atol=1e-6)


def test_moving_a_tensor_is_differentiable():
    x = Tensor(np.array([1.0, 2.0], np.float32), requires_grad=True)
    (x.to("sim") * 3).sum().backward()
    assert x.grad.device == "cpu"
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 3.0])


@pytest.mark.parametrize("opt", ["SGD", "Adam"])
def test_training_on_the_device_equals_training_on_the_cpu(opt):
    x, y = _data()
    results = {}
    for device in ("cpu", "sim"):
        model = _model().to(device)
        assert all(p.device == device for p in model.parameters())
        optimizer = (T.SGD(model.parameters(), 0.1, momentum=0.9) if opt == "SGD"
                     else T.Adam(model.parameters(), 0.01))
        trace = []
        for _ in range(5):
            optimizer.zero_grad()
            loss = losses.cross_entropy(model(Tensor(x, device=device)),
                                        Tensor(y, device=device))
            loss.backward()
            optimizer.step()
            trace.append(loss.item())
        results[device] = (trace, {k: v.cpu().numpy() for k, v in model.state_dict().items()})
    np.testing.assert_allclose(results["sim"][0], results["cpu"][0], rtol=1e-6)
    for k, v in results["cpu"][1].items():
        np.testing.assert_allclose(results["sim"][1][k], v, rtol=1e-5, atol=1e-6)


def test_moving_a_model_there_and_back_changes_no_result():
    x, _ = _data(3)
    model = _model(4)
    before = model(Tensor(x)).numpy()
    on_sim = model.to("sim")(Tensor(x, device="sim")).cpu().numpy()
    after = model.to("cpu")(Tensor(x)).numpy()
    np.testing.assert_allclose(on_sim, before, rtol=1e-6)
    np.testing.assert_array_equal(after, before)


@pytest.mark.parametrize("opt", ["SGD", "Adam"])
def test_an_optimizer_keeps_working_when_its_model_moves_mid_training(opt):
    x, y = _data()
    results = {}
    for move in (False, True):
        model = _model()
        optimizer = (T.SGD(model.parameters(), 0.1, momentum=0.9) if opt == "SGD"
                     else T.Adam(model.parameters(), 0.01))
        for step in range(4):
            if move and step == 2:
                model.to("sim")  # the optimizer's state (momentum, moments) follows
            device = next(iter(model.parameters())).device
            optimizer.zero_grad()
            losses.cross_entropy(model(Tensor(x, device=device)),
                                 Tensor(y, device=device)).backward()
            optimizer.step()
        results[move] = {k: v.cpu().numpy() for k, v in model.state_dict().items()}
    for k, v in results[False].items():
        np.testing.assert_allclose(results[True][k], v, rtol=1e-5, atol=1e-6)


def test_checkpoints_hold_host_arrays_and_load_onto_any_device(tmp_path):
    model = _model(5).to("sim")
    T.Checkpoint.save(tmp_path / "m.ckpt", model)
    on_cpu = _model(6)
    T.Checkpoint.load(tmp_path / "m.ckpt", on_cpu)
    back_on_sim = _model(7).to("sim")
    T.Checkpoint.load(tmp_path / "m.ckpt", back_on_sim)
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(on_cpu.state_dict()[k].numpy(), v.cpu().numpy())
        assert back_on_sim.state_dict()[k].device == "sim"
        np.testing.assert_array_equal(back_on_sim.state_dict()[k].cpu().numpy(),
                                      v.cpu().numpy())


def test_an_optimizer_checkpoint_from_the_device_resumes_training_anywhere(tmp_path):
    x, y = _data(6)

    def steps(model, optimizer, device, n):
        for _ in range(n):
            optimizer.zero_grad()
            losses.cross_entropy(model(Tensor(x, device=device)),
                                 Tensor(y, device=device)).backward()
            optimizer.step()

    reference = _model(9)
    ref_opt = T.Adam(reference.parameters(), 0.01)
    steps(reference, ref_opt, "cpu", 4)
    for resume_on in ("cpu", "sim"):
        model = _model(9).to("sim")
        optimizer = T.Adam(model.parameters(), 0.01)
        steps(model, optimizer, "sim", 2)
        T.Checkpoint.save(tmp_path / "run.ckpt", model, optimizer)  # host arrays
        fresh = _model(10).to(resume_on)
        fresh_opt = T.Adam(fresh.parameters(), 0.01)
        T.Checkpoint.load(tmp_path / "run.ckpt", fresh, fresh_opt)
        steps(fresh, fresh_opt, resume_on, 2)
        for k, v in reference.state_dict().items():
            np.testing.assert_allclose(fresh.state_dict()[k].cpu().numpy(), v.numpy(),
                                       rtol=1e-5, atol=1e-6)


# sessions and tracing ------------------------------------------------------------------------

def _traced(tmp_path, device):
    model = _model(8).to(device)
    traced = model.trace(Tensor(np.zeros((2, 6), np.float32), device=device), "batch", None)
    path = tmp_path / f"m_{device}.onemodel"
    traced.save(path)
    return model.to("cpu"), path


def test_a_model_traced_on_the_device_runs_in_sessions_on_every_device(tmp_path):
    eager, path = _traced(tmp_path, "sim")  # tracing is device-independent
    x = np.random.default_rng(9).standard_normal((5, 6)).astype(np.float32)
    expected = eager(Tensor(x)).numpy()
    cpu = Session.load(path).run({"input": x}, return_numpy=True)
    sim = Session.load(path, device="sim").run({"input": x}, return_numpy=True)
    for out in (cpu, sim):
        (value,) = out.values()
        assert isinstance(value, np.ndarray)
        np.testing.assert_allclose(value, expected, rtol=1e-5, atol=1e-6)


def test_a_session_places_initializers_once_and_keeps_outputs_on_the_device_if_asked(tmp_path):
    _, path = _traced(tmp_path, "cpu")
    # unoptimized, the graph is Gemm and Relu, which the sim device has kernels for
    session = Session.load(path, device="sim", outputs_on_device=True, optimize=False)
    x = np.ones((3, 6), np.float32)
    session.run({"input": x})  # builds and places the plan
    devices.reset_transfer_stats()
    (out,) = session.run({"input": x}).values()
    assert out.device == "sim" and isinstance(out._data, SimArray)
    stats = devices.transfer_stats()
    assert stats.get("to_device") == 1 and not stats.get("to_host")  # the feed only


def test_a_session_on_a_strict_device_without_a_kernel_fails_naming_op_and_device(tmp_path):
    _, path = _traced(tmp_path, "cpu")
    session = Session.load(path, device="sim-strict")  # optimized: a FusedGemm it lacks
    x = np.ones((3, 6), np.float32)
    with pytest.raises(OneModelError, match=r"FusedGemm.*'sim-strict'"):
        session.run({"input": x})


# operators' controls ------------------------------------------------------------------------

def _python(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=120)


def test_a_denied_plugin_provides_no_device():
    code = ("from onemodel.tensors import Tensor\n"
            "try:\n    Tensor([1.0], device='sim')\nexcept Exception as e:\n    print(e)\n")
    out = _python(code, ONEMODEL_DISABLE_PLUGINS="sim")
    assert "no backend provides device 'sim'" in out.stdout, out.stderr


def test_a_plugin_that_fails_to_import_is_skipped_with_a_warning():
    code = ("import warnings\nwarnings.simplefilter('always')\n"
            "from onemodel.tensors import Tensor\n"
            "print((Tensor([1.0]) + 1).tolist())\n"
            "try:\n    Tensor([1.0], device='sim')\nexcept Exception as e:\n    print(e)\n")
    out = _python(code, ONEMODEL_SIM_FAIL_IMPORT="1")
    assert "[2.0]" in out.stdout and "no backend provides device 'sim'" in out.stdout
    assert "failed to import and was skipped" in out.stderr and "sim" in out.stderr


def test_sizes_only_data_decides_plan_on_the_device_too():
    pytest.importorskip("onnx")
    from onnx import TensorProto as TP
    from onnx import helper

    from onemodel.onnx.importer import from_model

    g = helper.make_graph(
        [helper.make_node("Greater", ["x", "zero"], ["pos"]),
         helper.make_node("NonZero", ["pos"], ["idx"]),
         helper.make_node("Transpose", ["idx"], ["idx_t"]),
         helper.make_node("GatherND", ["x", "idx_t"], ["vals"]),
         helper.make_node("Mul", ["vals", "vals"], ["sq"])],
        "nonzero", [helper.make_tensor_value_info("x", TP.FLOAT, ["n", 3])],
        [helper.make_tensor_value_info("sq", TP.FLOAT, [None])],
        [helper.make_tensor("zero", TP.FLOAT, [], [0.0])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    cpu, sim = Session(from_model(model)), Session(from_model(model), device="sim")
    rng = np.random.default_rng(4)
    for n in (4, 6, 4):
        x = rng.normal(size=(n, 3)).astype(np.float32)
        (want,) = cpu.run({"x": x}, return_numpy=True).values()
        (got,) = sim.run({"x": x}, return_numpy=True).values()
        np.testing.assert_array_equal(got, want)


def test_sequence_outputs_come_back_element_by_element():
    pytest.importorskip("onnx")
    from onnx import TensorProto as TP
    from onnx import helper

    from onemodel.onnx.importer import from_model

    seq = helper.make_sequence_type_proto(helper.make_tensor_type_proto(TP.FLOAT, None))
    g = helper.make_graph(
        [helper.make_node("SplitToSequence", ["x"], ["s"], axis=0),  # no sim kernel: the CPU
         helper.make_node("Shape", ["x"], ["sh"])],
        "seq", [helper.make_tensor_value_info("x", TP.FLOAT, [3, 2])],
        [helper.make_value_info("s", seq), helper.make_tensor_value_info("sh", TP.INT64, [2])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    host = Session(from_model(model), device="sim").run({"x": x}, return_numpy=True)
    assert [r.tolist() for r in host["s"]] == [[[0.0, 1.0]], [[2.0, 3.0]], [[4.0, 5.0]]]
    assert host["sh"].tolist() == [3, 2]
    kept = Session(from_model(model), device="sim", outputs_on_device=True).run({"x": x})
    assert [t.device for t in kept["s"]] == ["sim"] * 3 and kept["sh"].device == "sim"
    assert kept["s"][2].tolist() == [[4.0, 5.0]] and kept["sh"].tolist() == [3, 2]
