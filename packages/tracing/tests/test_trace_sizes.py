"""Python decisions on symbolic sizes: unrolled when the size is fixed, guarded when the outcome
holds for a range of sizes, refused when it would pin an axis, and caught by the second trace
when Python hides the size (range(), len(), int()). Every refusal names the axis, the operation
and the user's exact file:line (the line marked in the source below)."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from onemodel.runtime import Session
from onemodel.runtime.guards import GuardError
from onemodel.tensors import Generator, Tensor
from onemodel.tracing import TraceError, Tracer
from onemodel.training import Linear, Module

HERE = __file__


def line_of(fn, marker: str) -> str:
    """``file:line`` of the line of ``fn`` that holds ``marker``."""
    lines, start = inspect.getsourcelines(fn)
    return f"{HERE}:{start + next(i for i, s in enumerate(lines) if marker in s)}"


def f32(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# guards -----------------------------------------------------------------------------------------

def big_batch_doubles(x):
    if x.shape[0] > 2:  # decision
        return x * 2
    return x + 1


def test_branch_on_a_symbolic_size_becomes_a_guard_shown_in_the_report():
    traced = Tracer(big_batch_doubles).trace({"x": Tensor.randn(4, 3)}, axes={"x": ("batch", None)})
    (guard,) = traced.graph.guards
    assert (guard.condition, guard.axis) == ("batch > 2", "batch")
    assert guard.location == line_of(big_batch_doubles, "# decision")
    assert f"guard  batch > 2  (axis batch, decided at {guard.location})" in traced.report()


def _assert_guarded(session: Session, location: str) -> None:
    x = f32(3, 3)
    np.testing.assert_array_equal(session.run({"x": x})["output"].numpy(), x * 2)
    with pytest.raises(GuardError) as err:
        session.run({"x": f32(1, 3)})
    msg = str(err.value)
    assert "batch=1" in msg and "'batch > 2'" in msg and "axis 'batch'" in msg
    assert location in msg


def test_the_session_refuses_sizes_that_break_the_guard_also_after_save_and_load(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    traced = Tracer(big_batch_doubles).trace({"x": Tensor.randn(4, 3)}, axes={"x": ("batch", None)})
    location = line_of(big_batch_doubles, "# decision")
    _assert_guarded(traced.session(), location)
    traced.save(tmp_path / "m.onemodel")
    traced.save_onnx(tmp_path / "m.onnx")
    for name in ("m.onemodel", "m.onnx"):
        loaded = Session.load(tmp_path / name)
        assert [g.condition for g in loaded.graph.guards] == ["batch > 2"]
        _assert_guarded(loaded, location)
    # onnxruntime cannot enforce the guard: it is in the metadata, and batch 3 runs correctly
    meta = {p.key: p.value for p in onnx.load(str(tmp_path / "m.onnx")).metadata_props}
    assert '"condition":"batch > 2"' in meta["onemodel.guards"] and location in meta[
        "onemodel.guards"]
    x = f32(3, 3)
    got = ort.InferenceSession(str(tmp_path / "m.onnx"),
                               providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, x * 2)


def even_or_odd(x):
    if x.shape[1] % 2 == 0:  # decision
        return x.sum(1)
    return x.max(1)


@pytest.mark.parametrize("seq,condition,runs,refused", [
    (4, "seq % 2 == 0", (2, 6, 10), (3, 7)),
    (5, "seq % 2 != 0", (3, 7, 9), (2, 8)),
])
def test_parity_of_a_size_is_a_guard(seq, condition, runs, refused):
    traced = Tracer(even_or_odd).trace({"x": Tensor.randn(2, seq)}, axes={"x": (None, "seq")})
    assert [(g.condition, g.axis) for g in traced.graph.guards] == [(condition, "seq")]
    assert traced.graph.guards[0].location == line_of(even_or_odd, "# decision")
    session = traced.session()
    for n in runs:
        x = f32(2, n)
        want = x.sum(1) if n % 2 == 0 else x.max(1)
        np.testing.assert_allclose(session.run({"x": x})["output"].numpy(), want, rtol=1e-6)
    for n in refused:
        with pytest.raises(GuardError, match=f"seq={n} break the guard '{condition}'"):
            session.run({"x": f32(2, n)})


def test_a_guard_that_cannot_fail_is_not_recorded():
    def f(x):
        if x.shape[0] >= 0 and x.shape[0] == x.shape[0]:
            return x * 3
        return x

    traced = Tracer(f).trace({"x": Tensor.randn(4, 3)}, axes={"x": ("batch", None)})
    assert traced.graph.guards == []


def test_a_branch_on_a_fixed_size_is_unrolled_without_guard_or_error():
    def f(x):
        if x.shape[1] == 3:  # a fixed axis: a plain int, decided once
            return x * 2
        return x

    traced = Tracer(f).trace({"x": Tensor.randn(4, 3)}, axes={"x": ("batch", None)})
    assert traced.graph.guards == [] and "guard" not in traced.report()
    x = f32(7, 3)
    np.testing.assert_array_equal(traced.run({"x": x})["output"].numpy(), x * 2)


# refused: decisions that pin an axis ------------------------------------------------------------

def only_four(x):
    if x.shape[1] == 4:  # pins
        return x * 2
    return x


def test_an_equality_on_a_symbolic_size_is_refused():
    with pytest.raises(TraceError) as err:
        Tracer(only_four).trace({"x": Tensor.randn(3, 4)}, axes={"x": (None, "seq")})
    msg = str(err.value)
    assert "'seq == 4'" in err.value.operation and "symbolic axis 'seq'" in err.value.operation
    assert "holds only for seq=4" in msg and "declare the axis fixed" in msg
    assert err.value.location == line_of(only_four, "# pins")
    assert msg.endswith(f"(at {err.value.location})")


def between(x):
    if 3 < x.shape[0]:  # lower  # noqa: SIM102, SIM300 - int < SymInt on purpose
        if x.shape[0] < 5:  # upper
            return x * 2
    return x


def test_guards_that_together_pin_an_axis_are_refused():
    with pytest.raises(TraceError) as err:
        Tracer(between).trace({"x": Tensor.randn(4, 3)}, axes={"x": ("batch", None)})
    msg = str(err.value)
    assert "symbolic axis 'batch'" in err.value.operation
    assert "'batch > 3'" in msg and "'batch < 5'" in msg and "only batch=4" in msg
    assert err.value.location == line_of(between, "# lower")


def rnn_over_sequence(x):
    h = x[:, 0]
    for t in range(1, x.shape[1]):  # range() takes the int as it is: no hook for a tracer
        h = (h + x[:, t]).tanh()  # unrolled
    return h * 2


def test_a_range_loop_over_a_symbolic_axis_is_refused():
    with pytest.raises(TraceError) as err:
        Tracer(rnn_over_sequence).trace({"x": Tensor.randn(3, 4, 2)},
                                        axes={"x": ("batch", "seq", None)})
    msg = str(err.value)
    assert err.value.operation == "Python control flow on the size of symbolic axis 'seq'"
    assert "seq=4" in msg and "range(x.shape[i])" in msg and "declare the axis fixed" in msg
    assert err.value.location == line_of(rnn_over_sequence, "# unrolled")
    assert "= Slice(x, " in msg  # the first node where the two traces part: the extra iteration


def test_a_range_loop_over_a_fixed_axis_is_unrolled():
    traced = Tracer(rnn_over_sequence).trace({"x": Tensor.randn(3, 4, 2)},
                                             axes={"x": ("batch", None, None)})
    for b in (1, 5):
        x = f32(b, 4, 2)
        want = rnn_over_sequence(Tensor.from_numpy(x)).numpy()
        np.testing.assert_allclose(traced.run({"x": x})["output"].numpy(), want, rtol=1e-6)


def halve_even_batches(x):
    n = int(x.shape[0])  # int() drops the symbol without asking it
    if n % 2 == 0:
        return x * 0.5
    return x - 1  # other branch


def test_a_hidden_size_decision_is_caught_only_by_the_structural_check():
    example = {"x": Tensor.randn(4, 3)}
    axes = {"x": ("batch", None)}
    unchecked = Tracer(halve_even_batches).trace(example, axes=axes, verify=False)
    assert unchecked.graph.guards == []  # no guard could see it: this graph is silently wrong
    assert unchecked.check({"batch": [3]}).largest > 0.1
    with pytest.raises(TraceError) as err:
        Tracer(halve_even_batches).trace(example, axes=axes)
    msg = str(err.value)
    assert err.value.operation == "Python control flow on the size of symbolic axis 'batch'"
    assert "batch=4" in msg and "batch=5" in msg
    assert err.value.location == line_of(halve_even_batches, "# other branch")
    assert "= Mul(" in msg and "= Sub(" in msg  # the two nodes where the traces part


def numpy_mean(x):
    count = Tensor.from_numpy(np.full((1, 1), x.shape[0], np.float32))  # numpy freezes the size
    return x.sum(0, keepdims=True) / count  # divide


def test_a_constant_made_with_a_frozen_size_is_caught():
    with pytest.raises(TraceError, match="constant const_1 holds different values in the two "
                                         "traces") as err:
        Tracer(numpy_mean).trace({"x": Tensor.randn(4, 3)}, axes={"x": ("batch", None)})
    assert err.value.location == line_of(numpy_mean, "# divide")
    assert "read by node Div_" in str(err.value)


def test_the_second_trace_leaves_the_tracer_and_module_as_the_first_left_them():
    calls = []

    def f(x):
        calls.append(tuple(int(d) for d in x.shape))
        return x * 2

    tracer = Tracer(f)
    traced = tracer.trace({"x": Tensor.randn(4, 3)}, axes={"x": ("batch", None)})
    assert calls == [(4, 3), (5, 3)] and tracer.graph is traced.graph
    assert tracer._examples == {"batch": 4}
    calls.clear()
    Tracer(f).trace({"x": Tensor.randn(4, 3)})  # nothing symbolic: one trace
    assert calls == [(4, 3)]


# len() and iteration ----------------------------------------------------------------------------

def count_rows(x):
    return x * len(x)  # len


def test_len_of_a_symbolic_axis_is_refused():
    with pytest.raises(TraceError) as err:
        Tracer(count_rows).trace({"x": Tensor.randn(4, 3)}, axes={"x": ("batch", None)})
    assert err.value.operation.startswith("len() along symbolic axis 'batch'")
    assert "use x.shape[0], which stays symbolic" in str(err.value)
    assert err.value.location == line_of(count_rows, "# len")


def test_len_of_a_fixed_axis_is_its_size():
    traced = Tracer(count_rows).trace({"x": Tensor.randn(4, 3)}, axes={"x": (None, "n")})
    x = f32(4, 6)
    np.testing.assert_allclose(traced.run({"x": x})["output"].numpy(), x * 4, rtol=1e-6)


def unpack_rows(x):
    first, second = x  # unpack
    total = first * second
    for row in x:  # iterate
        total = total + row
    return total


def test_iteration_along_a_fixed_axis_is_unrolled():
    traced = Tracer(unpack_rows).trace({"x": Tensor.randn(2, 5)}, axes={"x": (None, "n")})
    for n in (1, 3, 8):
        x = f32(2, n, seed=n)
        np.testing.assert_allclose(traced.run({"x": x})["output"].numpy(),
                                   x[0] * x[1] + x[0] + x[1], rtol=1e-6)


def test_iteration_along_a_symbolic_axis_is_refused():
    with pytest.raises(TraceError) as err:
        Tracer(unpack_rows).trace({"x": Tensor.randn(2, 5)}, axes={"x": ("batch", None)})
    assert err.value.operation.startswith(
        "iterating over a traced tensor along symbolic axis 'batch'")
    assert err.value.location == line_of(unpack_rows, "# unpack")


# creation with symbolic sizes ---------------------------------------------------------------------

def created(x):
    b = x.shape[0]
    pos = Tensor.arange(b).cast("F32").reshape(-1, 1)  # Range over the batch
    z = Tensor.zeros(b, 3) + Tensor.ones(b, 1) * 2 + Tensor.full((b, 3), 0.5)
    row = Tensor.from_data([1.0, 2.0, 3.0], 1, 3).expand(b, 3)
    return x * pos + z + row + Tensor.arange(1, b, 2).cast("F32").sum()


def created_numpy(x):
    b = x.shape[0]
    pos = np.arange(b, dtype=np.float32).reshape(-1, 1)
    return x * pos + 2.5 + np.array([1, 2, 3], np.float32) + np.arange(1, b, 2).sum()


def test_creation_with_symbolic_sizes_becomes_graph_nodes(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    traced = Tracer(created).trace({"x": Tensor.randn(4, 3)}, axes={"x": ("batch", None)})
    ops = [n.op for n in traced.graph.nodes]
    assert ops.count("Range") == 2 and ops.count("Expand") == 4
    assert traced.outputs[0].shape == ("batch", 3) and traced.graph.guards == []
    traced.save_onnx(tmp_path / "created.onnx")
    traced.save(tmp_path / "created.onemodel")
    onnx_session = ort.InferenceSession(str(tmp_path / "created.onnx"),
                                        providers=["CPUExecutionProvider"])
    native = Session.load(tmp_path / "created.onemodel")
    for b in (1, 3, 17):
        x = f32(b, 3, seed=b)
        want = created_numpy(x)
        np.testing.assert_allclose(traced.run({"x": x})["output"].numpy(), want, rtol=1e-6)
        np.testing.assert_allclose(native.run({"x": x})["output"].numpy(), want, rtol=1e-6)
        np.testing.assert_allclose(onnx_session.run(None, {"x": x})[0], want, rtol=1e-6)
        np.testing.assert_allclose(created(Tensor.from_numpy(x)).numpy(), want, rtol=1e-6)


# a GRU-style loop ---------------------------------------------------------------------------------

class GRULoop(Module):
    """A GRU cell written by hand and applied over the sequence with a Python loop."""

    def __init__(self, n_in: int, hidden: int):
        super().__init__()
        self.hidden = hidden
        self.x2h = Linear(n_in, 3 * hidden, Generator(1))
        self.h2h = Linear(hidden, 3 * hidden, Generator(2))

    def forward(self, x):
        H = self.hidden
        h = Tensor.zeros(x.shape[0], H)
        for t in range(x.shape[1]):
            gx, gh = self.x2h(x[:, t]), self.h2h(h)  # step
            r = (gx[:, :H] + gh[:, :H]).sigmoid()
            z = (gx[:, H:2 * H] + gh[:, H:2 * H]).sigmoid()
            n = (gx[:, 2 * H:] + r * gh[:, 2 * H:]).tanh()
            h = (1 - z) * n + z * h
        return h


def torch_gru(model: GRULoop, x: np.ndarray) -> np.ndarray:
    torch = pytest.importorskip("torch")
    gru = torch.nn.GRU(x.shape[2], model.hidden, batch_first=True)
    with torch.no_grad():
        gru.weight_ih_l0.copy_(torch.from_numpy(model.x2h.weight.numpy()))
        gru.bias_ih_l0.copy_(torch.from_numpy(model.x2h.bias.numpy()))
        gru.weight_hh_l0.copy_(torch.from_numpy(model.h2h.weight.numpy()))
        gru.bias_hh_l0.copy_(torch.from_numpy(model.h2h.bias.numpy()))
        return gru(torch.from_numpy(x))[1][0].numpy()


def test_a_gru_loop_over_a_fixed_sequence_length_traces_and_matches_eager_and_torch():
    model = GRULoop(3, 4)
    traced = Tracer(model).trace({"x": Tensor.randn(2, 5, 3)}, axes={"x": ("batch", None, None)})
    assert traced.graph.guards == []
    for b in (1, 3, 17):
        x = f32(b, 5, 3, seed=b)
        got = traced.run({"x": x})["output"].numpy()
        np.testing.assert_allclose(got, model(Tensor.from_numpy(x)).numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got, torch_gru(model, x), rtol=1e-4, atol=1e-5)
    assert traced.check().ok


def test_the_same_gru_loop_with_a_symbolic_sequence_is_refused():
    with pytest.raises(TraceError) as err:
        Tracer(GRULoop(3, 4)).trace({"x": Tensor.randn(2, 5, 3)},
                                    axes={"x": ("batch", "seq", None)})
    msg = str(err.value)
    assert err.value.operation == "Python control flow on the size of symbolic axis 'seq'"
    assert "seq=5" in msg and "declare the axis fixed" in msg
    assert err.value.location == line_of(GRULoop.forward, "# step")


# check() ----------------------------------------------------------------------------------------

def test_check_tries_every_combination_and_respects_guards():
    def f(x):
        if x.shape[0] > 1:
            return x.sum(1, keepdims=True) * x
        return x

    traced = Tracer(f).trace({"x": Tensor.randn(2, 5)}, axes={"x": ("batch", "n")})
    report = traced.check({"batch": [1, 2, 4], "n": [1, 3]})
    assert set(report.differences) == {f"batch={b}, n={n}" for b in (2, 4) for n in (1, 3)}
    assert set(report.skipped) == {"batch=1, n=1", "batch=1, n=3"}
    assert report.ok
    text = str(report)
    assert "batch=4, n=3: largest difference" in text
    assert "batch=1, n=1: skipped, breaks the guard 'batch > 1'" in text
    defaults = traced.check()  # 1, the example size and 2x+1 per axis: 3 x 3 combinations
    assert len(defaults.differences) + len(defaults.skipped) == 9
    assert "batch=5, n=11" in defaults.differences


def test_check_samples_when_the_combinations_are_many():
    from onemodel.tracing.model import size_combinations

    per_axis = {"a": list(range(1, 11)), "b": list(range(1, 11))}
    sample = size_combinations(per_axis, {"a": 2, "b": 3}, limit=64)
    assert {"a": 1, "b": 1} in sample and {"a": 10, "b": 10} in sample
    assert {"a": 7, "b": 3} in sample and {"a": 2, "b": 9} in sample
    assert len(sample) == 10 + 10 - 1 + 2  # the example point appears once
    assert len(size_combinations({"a": [1, 2], "b": [3, 4]}, {"a": 2, "b": 3})) == 4


TABLE = [Tensor.ones(3) * i for i in range(5)]  # one row per batch size up to 4


def by_batch_size(x):
    return x + TABLE[x.shape[0]]  # lookup


def test_a_second_trace_that_fails_is_a_trace_error_at_the_users_line():
    with pytest.raises(TraceError) as err:
        Tracer(by_batch_size).trace({"x": Tensor.randn(4, 3)}, axes={"x": ("batch", None)})
    msg = str(err.value)
    assert "the second trace failed with IndexError" in msg and "batch=5" in msg
    assert err.value.location == line_of(by_batch_size, "# lookup")


def test_numpy_numbers_and_symbolic_fill_values_are_seen():
    def f(x):
        if x.shape[0] > np.int64(2):  # numpy int
            return x * Tensor.full((1, x.shape[1]), x.shape[0])  # the batch size as a value
        return x

    traced = Tracer(f).trace({"x": Tensor.randn(4, 3)}, axes={"x": ("batch", None)})
    assert [g.condition for g in traced.graph.guards] == ["batch > 2"]
    for b in (3, 6):
        x = f32(b, 3, seed=b)
        np.testing.assert_allclose(traced.run({"x": x})["output"].numpy(), x * b, rtol=1e-6)


def test_a_constant_drawn_at_random_in_forward_is_not_taken_for_a_size():
    def noisy(x):
        return x + Tensor.randn(1, 3)  # a new draw in each trace, at any size

    traced = Tracer(noisy).trace({"x": Tensor.randn(4, 3)}, axes={"x": ("batch", None)})
    (noise,) = traced.graph.initializers.values()
    x = f32(5, 3)
    np.testing.assert_allclose(traced.run({"x": x})["output"].numpy(), x + noise, rtol=1e-6)


def stepped(x):
    n = x.shape[1]
    return x * Tensor.arange(n, dtype="F32") + Tensor.arange(1, n * 2, 2).cast("F32")


def test_arange_with_a_step_and_a_float_dtype_over_a_symbolic_bound():
    traced = Tracer(stepped).trace({"x": Tensor.randn(2, 4)}, axes={"x": (None, "n")})
    assert traced.outputs[0].shape == (2, "n")
    for n in (1, 3, 9):
        x = f32(2, n, seed=n)
        np.testing.assert_allclose(traced.run({"x": x})["output"].numpy(),
                                   x * np.arange(n) + np.arange(1, 2 * n, 2), rtol=1e-6)


def fractional(x):
    return x + Tensor.arange(0.5, x.shape[1])  # fractional start


def test_arange_with_a_fractional_start_over_a_symbolic_bound_is_refused():
    with pytest.raises(TraceError) as err:
        Tracer(fractional).trace({"x": Tensor.randn(2, 4)}, axes={"x": (None, "n")})
    assert "arange with a symbolic bound" in err.value.operation
    assert err.value.location == line_of(fractional, "# fractional start")
