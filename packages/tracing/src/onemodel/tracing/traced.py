"""TracedTensor: what the traced function sees in place of real data during a trace."""

from __future__ import annotations

from onemodel.tensors import OneModelError, Tensor
from onemodel.tensors.symbolic import SymInt


class TracedData:
    """Stands in for the numpy array of a traced tensor: it knows the dtype and the shape (ints
    and SymInts), and refuses everything that would read values."""

    __slots__ = ("dtype", "name", "ndim", "shape", "tracer")

    def __init__(self, tracer, name: str, dtype, shape: tuple):
        self.tracer, self.name, self.dtype, self.shape = tracer, name, dtype, shape
        self.ndim = len(shape)

    @property
    def size(self):
        out = 1
        for d in self.shape:
            out = out * d
        return out

    def __getattr__(self, attr):
        self.tracer.refuse(f"reading the data of a traced tensor ({attr})",
                           "its values are unknown until the graph runs",
                           "compute with tensor operations instead")

    def __array__(self, *args, **kwargs):
        self.tracer.refuse("converting a traced tensor to a numpy array",
                           "its values are unknown until the graph runs",
                           "compute with tensor operations instead")

    def __len__(self):
        return int(self.shape[0])  # OneModel's own use; TracedTensor.__len__ guards the user's


def _symbolic_axis0(t: TracedTensor, what: str, hint: str) -> None:
    if not t.ndim:
        raise OneModelError(f"{what}: the tensor is 0-d (it has no axis 0)")
    size = t.shape[0]
    if isinstance(size, SymInt):
        t._data.tracer.refuse(
            f"{what} along symbolic axis {str(size.expr)!r} (axis 0 of a traced tensor)",
            "the number of items is that axis's size, which changes from run to run; the graph "
            f"would be frozen to its example size {int(size)}", hint)


def _refuse_read(what: str):
    def method(self, *args, **kwargs):
        self._data.tracer.refuse(
            f"Tensor.{what}", "it reads the values of a traced tensor, which are unknown until "
            "the graph runs (branches on them would be frozen into the graph)",
            "use tensor operations such as where() instead of Python control flow on values")

    method.__name__ = what
    return method


def _refuse_inplace(what: str):
    def method(self, *args, **kwargs):
        self._data.tracer.refuse(
            f"Tensor.{what}", "in-place changes have no place in a static graph",
            "write y = x + 1 instead of changing x")

    method.__name__ = what
    return method


class TracedTensor(Tensor):
    """A graph value during a trace. Its shape has SymInts for symbolic axes."""

    __slots__ = ()
    _traced = True

    @property
    def name(self) -> str:
        return self._data.name

    def detach(self) -> TracedTensor:
        return self

    def __repr__(self) -> str:
        shape = ", ".join(str(getattr(d, "expr", d)) for d in self.shape)
        return f"TracedTensor({self.name}, {self.dtype.name}[{shape}])"

    def __len__(self) -> int:
        _symbolic_axis0(self, "len()", "use x.shape[0], which stays symbolic, or declare the "
                        "axis fixed (None in the axes)")
        return int(self.shape[0])

    def __iter__(self):
        """Unrolled along a fixed axis 0 (``a, b = x``, ``for row in x``); refused along a
        symbolic one."""
        _symbolic_axis0(self, "iterating over a traced tensor",
                        "compute with tensor ops over the whole axis, or declare the axis fixed "
                        "(None in the axes) if it always has this size")
        return (self[i] for i in range(int(self.shape[0])))

    numpy = _refuse_read("numpy()")
    to_array = _refuse_read("to_array()")
    tolist = _refuse_read("tolist()")
    item = _refuse_read("item()")
    __array__ = _refuse_read("__array__()")
    __float__ = _refuse_read("__float__() (float(tensor))")
    __int__ = _refuse_read("__int__() (int(tensor))")
    __index__ = _refuse_read("__index__()")
    __bool__ = _refuse_read("__bool__() (an if or while on a tensor)")
    backward = _refuse_inplace("backward()")
    __setitem__ = _refuse_inplace("__setitem__ (x[...] = value)")
    add_ = _refuse_inplace("add_()")
    sub_ = _refuse_inplace("sub_()")
    mul_ = _refuse_inplace("mul_()")
    div_ = _refuse_inplace("div_()")
    fill_ = _refuse_inplace("fill_()")
    zero_ = _refuse_inplace("zero_()")
    copy_ = _refuse_inplace("copy_()")
    requires_grad_ = _refuse_inplace("requires_grad_()")
    __iadd__ = _refuse_inplace("__iadd__ (+=)")
    __isub__ = _refuse_inplace("__isub__ (-=)")
    __imul__ = _refuse_inplace("__imul__ (*=)")
    __itruediv__ = _refuse_inplace("__itruediv__ (/=)")
