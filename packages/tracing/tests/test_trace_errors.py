"""Every TraceError case: the message names the operation and the user's file and line (the
line marked ``# refused`` in each function below), and says what to do instead."""

from __future__ import annotations

import inspect

import pytest

from onemodel.tensors import Generator, Tensor, no_grad
from onemodel.tensors import functional as F
from onemodel.tracing import TraceError, Tracer
from onemodel.training import BatchNorm1d, Dropout, Linear, Module, losses


def read_numpy(x):
    return x * x.numpy().sum()  # refused


def read_to_array(x):
    return x + x.to_array()[0]  # refused


def read_item(x):
    return x * x.sum().item()  # refused


def read_float(x):
    return x * float(x.sum())  # refused


def branch_on_value(x):
    if (x.sum() > 0):  # refused
        return x
    return -x


def setitem(x):
    x[0] = 1.0  # refused
    return x


def add_inplace(x):
    x.add_(1.0)  # refused
    return x


def iadd(x):
    x += 1.0  # refused
    return x


def inside_no_grad(x):
    with no_grad():  # refused
        return x * 2


def loss(x):
    return losses.mse(x, x * 0)  # refused


def training_dropout(x):
    return F.dropout(x, 0.5, training=True)  # refused


def ctc(x):
    return losses.ctc(x.log_softmax(-1), Tensor.ones(2, 3), [5, 5], [3, 3])  # refused


def make_symbolic_random(x):
    # zeros/ones/full/arange with symbolic sizes become graph nodes (test_symbolic_creation.py);
    # random values have no graph form, so a random tensor of a symbolic size is still refused
    return x + Tensor.randn(x.shape[0], 3)  # refused


class TrainingModeBatchNorm(Module):
    def __init__(self):
        super().__init__()
        self.bn = BatchNorm1d(3)

    def forward(self, x):
        return F.batch_norm(x, None, None, training=True)  # refused


CASES = [
    (read_numpy, "Tensor.numpy()"),
    (read_to_array, "Tensor.to_array()"),
    (read_item, "Tensor.item()"),
    (read_float, "Tensor.__float__()"),
    (branch_on_value, "Tensor.__bool__()"),
    (setitem, "Tensor.__setitem__"),
    (add_inplace, "Tensor.add_()"),
    (iadd, "Tensor.__iadd__"),
    (inside_no_grad, "no_grad()"),
    (loss, "losses.mse"),
    (training_dropout, "dropout in training mode"),
    (ctc, "losses.ctc"),
    (make_symbolic_random, "creating a tensor with a symbolic size"),
    (TrainingModeBatchNorm, "batch_norm in training mode"),
]


def _marked_line(obj) -> int:
    target = obj.forward if inspect.isclass(obj) else obj
    lines, start = inspect.getsourcelines(target)
    return start + next(i for i, line in enumerate(lines) if "# refused" in line)


@pytest.mark.parametrize("fn,operation", CASES, ids=[c[1] for c in CASES])
def test_trace_error_names_operation_and_source_line(fn, operation):
    target = fn() if inspect.isclass(fn) else fn
    with pytest.raises(TraceError) as err:
        Tracer(target).trace({"x": Tensor.randn(5, 3)}, axes={"x": ("batch", None)})
    e = err.value
    assert e.operation.startswith(operation)
    assert e.location == f"{__file__}:{_marked_line(fn)}"
    assert f"at {__file__}:{_marked_line(fn)}" in str(e)
    assert "cannot be traced" in str(e) and ";" in str(e)  # a reason and what to do instead


def test_untraceable_op_is_refused_by_name():
    from onemodel.tensors.dispatch import dispatch

    def f(x):
        return dispatch("SliceGrad", (x, Tensor.from_data([5, 3], dtype="I64"),
                                      Tensor.from_data([0], dtype="I64"),
                                      Tensor.from_data([1], dtype="I64")))

    with pytest.raises(TraceError, match="SliceGrad cannot be traced: it is a training-only op"):
        Tracer(f).trace({"x": Tensor.randn(5, 3)})


def test_every_gradient_kernel_is_marked_training_only():
    # a gradient kernel in a traced graph would export an op no other runtime knows
    from onemodel.tensors.ops import OPS

    grads = [name for name in OPS if name.endswith("Grad")]
    assert len(grads) > 10 and [g for g in grads if OPS[g].traceable] == []


def test_mode_is_restored_when_tracing_fails():
    class Broken(Module):
        def __init__(self):
            super().__init__()
            self.fc = Linear(3, 3, Generator(0))
            self.drop = Dropout(0.5)

        def forward(self, x):
            assert not self.training and not self.drop.training  # traced in eval mode
            return self.fc(x).numpy()

    m = Broken()
    with pytest.raises(TraceError):
        m.trace(Tensor.randn(4, 3), "batch", None)
    assert m.training and m.drop.training
    m.eval()
    with pytest.raises(TraceError):
        m.trace(Tensor.randn(4, 3), "batch", None)
    assert not m.training


@pytest.mark.parametrize("shape,axes,message", [
    ((1, 3), ("batch", None), "symbolic axis 'batch' .* has example size 1; it must be at least 2"),
    ((4, 4), ("batch", "time"), "symbolic axes 'batch' and 'time' .* both have example size 4"),
    ((4, 3), ("batch",), "input 'x' has 2 axes but 1 axis names were given"),
])
def test_symbolic_axes_are_checked(shape, axes, message):
    with pytest.raises(TraceError, match=message):
        Tracer(lambda x: x * 2).trace({"x": Tensor.randn(*shape)}, axes={"x": axes})
