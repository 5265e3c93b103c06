"""The Tensor: a numpy array with a dtype, autograd state and the methods users expect.

Every method that computes goes through :func:`onemodel.tensors.dispatch.dispatch` with an op of
the op set, so eager code, gradients and (later) tracing all see the same ops.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import devices, trace_state
from .dtype import DType, result_dtype
from .errors import AutogradError, OneModelError, ShapeError
from .generator import Generator, default_generator
from .ops.base import OpDef
from .symbolic import SymInt
from .torch_names import accept_torch_names

_I64 = np.dtype(np.int64)


def _ints(values) -> np.ndarray:
    return np.asarray(values, dtype=_I64)


class Tensor:
    """An n-dimensional array of one :class:`DType`, with autograd.

    Create tensors with the class methods (``Tensor.zeros(DType.F32, 4, 1)``,
    ``Tensor.from_data([1, 2], 2, 1)``, ``Tensor.from_numpy(a)``) or by computing with others.
    """

    __slots__ = ("__weakref__", "_data", "_device", "_index", "_node", "grad", "requires_grad")
    __array_priority__ = 1000  # numpy defers to our operators: ndarray + Tensor -> Tensor
    _traced = False  # True for the stand-ins a trace records (onemodel.tracing)

    def __init__(self, data, dtype: DType | str | None = None, requires_grad: bool = False,
                 device: str | None = None):
        if isinstance(data, Tensor):
            data = data._host()
        arr = np.asarray(data, dtype=None if dtype is None else DType.of(dtype).numpy)
        if dtype is None and arr.dtype == np.float64 and not isinstance(data, np.ndarray):
            arr = arr.astype(np.float32)  # Python floats default to F32, as in PyTorch
        DType.from_numpy(arr.dtype)  # refuse dtypes we have no DType for
        self._device = devices.normalize(device)
        self._data = devices.to_device(arr, self._device)
        self.requires_grad = bool(requires_grad)
        self.grad = None
        self._node = None
        self._index = 0

    @classmethod
    def _wrap(cls, arr: np.ndarray, device: str = "cpu") -> Tensor:
        """A Tensor over ``arr``, an array of ``device`` (no copy, no checks)."""
        t = object.__new__(cls)
        t._data = arr
        t._device = device
        t.requires_grad = False
        t.grad = None
        t._node = None
        t._index = 0
        return t

    # creation ---------------------------------------------------------------------------------
    @classmethod
    def zeros(cls, *shape, dtype=None, device=None) -> Tensor:
        """``Tensor.zeros(DType.F32, 4, 1)``, ``Tensor.zeros(4, 1)`` or ``Tensor.zeros((4, 1))``.
        While tracing, sizes such as ``x.shape[0]`` make a graph node (Expand of the value)."""
        dims, dt = _split_dtype(shape, dtype)
        return cls.full(dims, 0, dt, device=device)

    @classmethod
    def ones(cls, *shape, dtype=None, device=None) -> Tensor:
        dims, dt = _split_dtype(shape, dtype)
        return cls.full(dims, 1, dt, device=device)

    @classmethod
    def full(cls, shape, value, dtype=None, device=None) -> Tensor:
        out = cls._full(shape, value, dtype)
        return out if device is None else out.to(device)

    @classmethod
    def _full(cls, shape, value, dtype=None) -> Tensor:
        dt = DType.F32 if dtype is None else DType.of(dtype)
        dims = _dims((shape,) if isinstance(shape, (int, np.integer)) else tuple(shape))
        if trace_state.active is not None and any(isinstance(d, SymInt)
                                                  for d in (*dims, value)):
            # a symbolic size: Expand the value to a shape computed from the inputs' shapes
            target = trace_state.shape_operand(dims, sizes=False)
            fill = (trace_state.active.scalar_operand(value, dt.numpy)
                    if isinstance(value, SymInt) else cls._wrap(np.asarray(value, dt.numpy)))
            return dispatch("Expand", (fill, target))
        return cls._wrap(np.full(_shape_tuple(dims), value, dt.numpy))

    @classmethod
    def arange(cls, start, stop=None, step=1, dtype=None, device=None) -> Tensor:
        """``arange(n)``, ``arange(start, stop, step)``; a symbolic bound while tracing (such as
        ``x.shape[1]``) makes a Range node."""
        out = cls._arange(start, stop, step, dtype)
        return out if device is None else out.to(device)

    @classmethod
    def _arange(cls, start, stop=None, step=1, dtype=None) -> Tensor:
        if stop is None:
            start, stop = 0, start
        if dtype is None:
            ints = all(isinstance(v, (int, np.integer)) for v in (start, stop, step))
            dtype = DType.I64 if ints else DType.F32
        dt = DType.of(dtype)
        bounds = (start, stop, step)
        if trace_state.active is not None and any(isinstance(v, SymInt) for v in bounds):
            if not all(isinstance(v, (int, np.integer)) for v in bounds):
                trace_state.refuse("arange with a symbolic bound and a fractional start or step",
                                   "the number of elements would be frozen",
                                   "use integer bounds and scale the result")
            i64 = np.dtype(np.int64)  # sizes are integers; the graph casts after the Range
            out = dispatch("Range", tuple(
                trace_state.active.scalar_operand(v, i64) if isinstance(v, SymInt)
                else cls._wrap(np.asarray(v, i64)) for v in bounds))
            return out if dt is DType.I64 else out.cast(dt)
        return cls._wrap(np.arange(start, stop, step, dtype=dt.numpy))

    @classmethod
    def from_data(cls, values, *shape, dtype=DType.F32) -> Tensor:
        """A tensor holding ``values`` (a flat or nested sequence), reshaped to ``shape`` if given."""
        arr = np.array(values, dtype=DType.of(dtype).numpy)
        if shape:
            dims = _shape_tuple(shape)
            if int(np.prod(dims)) != arr.size:
                raise ShapeError(
                    f"from_data: {arr.size} values do not fill shape {list(dims)} "
                    f"({int(np.prod(dims))} elements)"
                )
            arr = arr.reshape(dims)
        return cls._wrap(arr)

    @classmethod
    def from_numpy(cls, array: np.ndarray) -> Tensor:
        """Wrap ``array`` without copying: changes to one show in the other."""
        if not isinstance(array, np.ndarray):
            raise OneModelError(f"from_numpy expects a numpy array, got {type(array).__name__}")
        DType.from_numpy(array.dtype)
        return cls._wrap(array)

    @classmethod
    def rand(cls, *shape, generator: Generator | None = None, dtype=DType.F32,
             device=None) -> Tensor:
        """Uniform samples in [0, 1) from ``generator`` (drawn on the host, then moved)."""
        g = generator or default_generator()
        out = cls._wrap(g.uniform(_shape_tuple(shape), dtype=dtype))
        return out if device is None else out.to(device)

    @classmethod
    def randn(cls, *shape, generator: Generator | None = None, dtype=DType.F32,
              device=None) -> Tensor:
        """Standard normal samples from ``generator`` (drawn on the host, then moved)."""
        g = generator or default_generator()
        out = cls._wrap(g.normal(_shape_tuple(shape), dtype=dtype))
        return out if device is None else out.to(device)

    # properties -------------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return self._data.shape

    @property
    def dtype(self) -> DType:
        return DType.from_numpy(self._data.dtype)

    @property
    def ndim(self) -> int:
        return self._data.ndim

    def size(self, dim: int | None = None):
        """PyTorch's ``size()``: the shape, or the extent of axis ``dim`` (symbolic while tracing).
        The element count is :meth:`numel` (numpy's ``size``)."""
        if dim is None:
            return self.shape
        nd = self.ndim
        if not -nd <= dim < max(nd, 1):
            raise ShapeError(f"size({dim}): axis out of range for a tensor of rank {nd}")
        return self.shape[dim]

    def numel(self):
        """The number of elements (a symbolic product while tracing)."""
        return math.prod(self.shape)

    @property
    def device(self) -> str:
        """Where the data lives: ``"cpu"`` or a device a backend plugin registered."""
        return self._device

    @property
    def is_leaf(self) -> bool:
        return self._node is None

    def __len__(self) -> int:
        if not self._data.ndim:
            raise OneModelError("len() of a 0-d tensor")
        return self._data.shape[0]

    def __iter__(self):
        """The sub-tensors along axis 0, as numpy and PyTorch give them (``a, b = x``)."""
        if not self._data.ndim:
            raise OneModelError("iteration over a 0-d tensor")
        return (self[i] for i in range(self._data.shape[0]))

    # reading data -----------------------------------------------------------------------------
    def numpy(self) -> np.ndarray:
        """The data as a numpy array (shared, not copied). A tensor on another device must be
        moved first (``x.cpu().numpy()``), as in PyTorch: the copy is then explicit."""
        if self._device != "cpu":
            raise devices.DeviceError(f"numpy() of a tensor on device {self._device!r}: call "
                                      ".cpu() first to copy it to host memory")
        return self._data

    def _host(self) -> np.ndarray:
        """The data in host memory (a counted copy for a tensor on another device)."""
        return self._data if self._device == "cpu" else devices.to_host(self._data, self._device)

    def to_array(self) -> list:
        """The data as a flat Python list."""
        return self._host().reshape(-1).tolist()

    def tolist(self):
        return self._host().tolist()

    def item(self):
        if self._data.size != 1:
            raise OneModelError(
                f"item() needs a one-element tensor, this one has shape {list(self.shape)}"
            )
        return self._host().reshape(()).item()

    def __array__(self, dtype=None, copy=None):
        if self._device != "cpu":
            raise devices.DeviceError(f"a tensor on device {self._device!r} cannot be used as a "
                                      "numpy array; call .cpu() first")
        if dtype is not None and np.dtype(dtype) != self._data.dtype:
            return self._data.astype(dtype)
        return self._data.copy() if copy else self._data

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __index__(self) -> int:
        if self.dtype.is_floating or self._data.size != 1:
            raise OneModelError("only one-element integer tensors can be used as an index")
        return int(self.item())

    def __bool__(self) -> bool:
        if self._data.size != 1:
            raise OneModelError(
                f"the truth value of a tensor of shape {list(self.shape)} is ambiguous; "
                "use .any() or .all()"
            )
        return bool(self._data.reshape(()))

    def __repr__(self) -> str:
        body = np.array2string(self._host(), separator=", ", precision=4, threshold=50,
                               prefix="Tensor(")
        extra = ", requires_grad=True" if self.requires_grad else ""
        if self._device != "cpu":
            extra = f", device={self._device!r}" + extra
        return f"Tensor({body}, dtype={self.dtype.name}, shape={list(self.shape)}{extra})"

    # autograd ---------------------------------------------------------------------------------
    def backward(self, gradient=None, *, retain_graph: bool = False,
                 create_graph: bool = False) -> None:
        from .autograd import backward

        backward(self, gradient, retain_graph=retain_graph, create_graph=create_graph)

    def detach(self) -> Tensor:
        """The same data, cut from the gradient tape."""
        return Tensor._wrap(self._data, self._device)

    def requires_grad_(self, flag: bool = True) -> Tensor:
        if self._node is not None and not flag:
            raise AutogradError("requires_grad_(False) on a non-leaf tensor; use detach()")
        if flag and not self.dtype.is_floating:
            raise AutogradError(f"only floating tensors can require grad, not {self.dtype.name}")
        self.requires_grad = flag
        return self

    def clone(self) -> Tensor:
        if self.requires_grad:
            return _call("Identity", self)
        return Tensor._wrap(self._data.copy(), self._device)

    # arithmetic -------------------------------------------------------------------------------
    def __add__(self, other):
        return _binary("Add", self, other)

    def __radd__(self, other):
        return _binary("Add", other, self)

    def __sub__(self, other):
        return _binary("Sub", self, other)

    def __rsub__(self, other):
        return _binary("Sub", other, self)

    def __mul__(self, other):
        return _binary("Mul", self, other)

    def __rmul__(self, other):
        return _binary("Mul", other, self)

    def __truediv__(self, other):
        return _binary("Div", self, other)

    def __rtruediv__(self, other):
        return _binary("Div", other, self)

    def __pow__(self, other):
        return _binary("Pow", self, other)

    def __rpow__(self, other):
        return _binary("Pow", other, self)

    def __matmul__(self, other):
        return _binary("MatMul", self, other)

    def __rmatmul__(self, other):
        return _binary("MatMul", other, self)

    def __neg__(self):
        return _call("Neg", self)

    def __pos__(self):
        return self

    def __abs__(self):
        return _call("Abs", self)

    def __eq__(self, other):  # type: ignore[override]
        return _binary("Equal", self, other)

    def __ne__(self, other):  # type: ignore[override]
        return _call("Not", _binary("Equal", self, other))

    def __lt__(self, other):
        return _binary("Less", self, other)

    def __le__(self, other):
        return _binary("LessOrEqual", self, other)

    def __gt__(self, other):
        return _binary("Greater", self, other)

    def __ge__(self, other):
        return _binary("GreaterOrEqual", self, other)

    def __invert__(self):
        return _call("Not", self)

    def __and__(self, other):
        return _binary("And", self, other)

    def __or__(self, other):
        return _binary("Or", self, other)

    __hash__ = object.__hash__

    def add(self, other, alpha=1):
        return self + (other * alpha if alpha != 1 else other)

    def sub(self, other, alpha=1):
        return self - (other * alpha if alpha != 1 else other)

    def mul(self, other):
        return self * other

    def div(self, other):
        return self / other

    def pow(self, exponent):
        return self**exponent

    def matmul(self, other):
        return self @ other

    # elementwise functions --------------------------------------------------------------------
    def exp(self):
        return _call("Exp", self)

    def log(self):
        return _call("Log", self)

    def sqrt(self):
        return _call("Sqrt", self)

    def abs(self):
        return _call("Abs", self)

    def sign(self):
        return _call("Sign", self)

    def neg(self):
        return _call("Neg", self)

    def tanh(self):
        return _call("Tanh", self)

    def sigmoid(self):
        return _call("Sigmoid", self)

    def relu(self):
        return _call("Relu", self)

    def erf(self):
        return _call("Erf", self)

    def gelu(self, approximate: str = "none"):
        return _call("Gelu", self, approximate=approximate)

    def softmax(self, axis: int = -1):
        return _call("Softmax", self, axis=axis)

    def log_softmax(self, axis: int = -1):
        return _call("LogSoftmax", self, axis=axis)

    def clip(self, min=None, max=None):
        lo = None if min is None else _scalar_like(min, self)
        hi = None if max is None else _scalar_like(max, self)
        return _call("Clip", self, lo, hi)

    clamp = clip

    def maximum(self, other) -> Tensor:
        """Elementwise maximum; at ties each side gets half the gradient, as in PyTorch."""
        return _extreme(self, other, Tensor.__gt__, Tensor.__ge__)

    def minimum(self, other) -> Tensor:
        """Elementwise minimum; at ties each side gets half the gradient, as in PyTorch."""
        return _extreme(self, other, Tensor.__lt__, Tensor.__le__)

    def masked_fill(self, mask, value) -> Tensor:
        """``value`` where ``mask`` is True, ``self`` elsewhere (the mask broadcasts)."""
        if isinstance(mask, Tensor) and mask.dtype is not DType.BOOL:
            raise OneModelError(f"masked_fill: the mask must be BOOL, not {mask.dtype.name}; "
                                "compare it first (mask > 0)")
        return where(mask, _scalar_like(value, self), self)

    def tril(self, diagonal: int = 0) -> Tensor:
        """Zero above the ``diagonal``-th diagonal of the last two axes (a Trilu mask and Where,
        so it differentiates and follows symbolic sizes)."""
        return where(self._triangle(diagonal, upper=0), self, _scalar_like(0, self))

    def triu(self, diagonal: int = 0) -> Tensor:
        """Zero below the ``diagonal``-th diagonal of the last two axes."""
        return where(self._triangle(diagonal, upper=1), self, _scalar_like(0, self))

    def _triangle(self, diagonal: int, upper: int) -> Tensor:
        if self.ndim < 2:
            raise ShapeError(f"tril/triu need at least 2 axes, got shape {list(self.shape)}")
        ones = Tensor._wrap(np.ones((), np.float32)).expand(*self.shape[-2:])
        return _call("Trilu", ones, _const(int(diagonal)), upper=upper) > 0.5

    def cumsum(self, axis: int) -> Tensor:
        """Running sum along ``axis`` (PyTorch's ``cumsum(dim)``): a matmul with a triangle of
        ones, so it has a gradient and traces for a fixed length of the axis."""
        if self.ndim == 0:
            return self
        ax = axis % self.ndim
        x = self if ax == self.ndim - 1 else self.transpose(ax, -1)
        n = int(x.shape[-1])
        y = x @ Tensor._wrap(np.triu(np.ones((n, n), x._data.dtype)))
        return y if ax == self.ndim - 1 else y.transpose(ax, -1)

    def norm(self, p=2, axis=None, keepdims: bool = False) -> Tensor:
        """The p-norm over ``axis`` (all elements by default): p = 2, 1, inf, -inf or any
        positive number, built from abs, powers and reductions."""
        a = self.abs()
        if p == 2:  # sqrt only of positive sums: a zero vector gets gradient 0, as in PyTorch
            ss = (self * self).sum(axis, keepdims=keepdims)
            pos = ss > 0
            return where(pos, where(pos, ss, _scalar_like(1, ss)).sqrt(), _scalar_like(0, ss))
        if p == 1:
            return a.sum(axis, keepdims=keepdims)
        if p == float("inf"):
            return a.max(axis, keepdims=keepdims)
        if p == float("-inf"):
            return a.min(axis, keepdims=keepdims)
        if isinstance(p, (int, float)) and p > 0:
            return (a**p).sum(axis, keepdims=keepdims) ** (1.0 / p)
        raise OneModelError(f"norm: p must be a positive number or +-inf, not {p!r}")

    def where(self, condition, other):
        """``condition ? self : other`` (PyTorch's ``Tensor.where``)."""
        return where(condition, self, other)

    def cast(self, dtype) -> Tensor:
        dt = DType.of(dtype)
        if dt is self.dtype:
            return self
        return _call("Cast", self, to=dt)

    astype = cast

    # PyTorch's conversions ----------------------------------------------------------------------
    def float(self) -> Tensor:
        return self.cast(DType.F32)

    def double(self) -> Tensor:
        return self.cast(DType.F64)

    def half(self) -> Tensor:
        return self.cast(DType.F16)

    def long(self) -> Tensor:
        return self.cast(DType.I64)

    def int(self) -> Tensor:
        return self.cast(DType.I32)

    def bool(self) -> Tensor:
        return self.cast(DType.BOOL)

    def to(self, *args, dtype=None, device=None, copy: bool = False) -> Tensor:
        """PyTorch's ``to``: ``to(dtype)``, ``to("cuda")``, ``to("cuda", dtype)``, ``to(other)``
        (its dtype and device). A move to another device copies through host memory and is
        differentiable: the gradient moves back. While tracing, devices are ignored (a traced
        graph runs on any device)."""
        for a in args:
            if isinstance(a, Tensor):
                dtype = a.dtype if dtype is None else dtype
                device = a.device if device is None else device
            elif isinstance(a, devices.Device) or hasattr(a, "type") or (
                    isinstance(a, str) and not _is_dtype_name(a)):
                device = a
            elif dtype is None:
                dtype = a
            else:
                raise OneModelError(f"to(): unexpected argument {a!r}; pass a dtype and/or a "
                                    "device")
        out = self if dtype is None else self.cast(dtype)
        if device is not None and not self._traced:
            target = devices.normalize(device)
            if target != out._device:
                devices.get_device(target)  # an unknown device fails here, naming it
                return _move(out, target)
        return out.clone() if copy and out is self else out

    def cpu(self) -> Tensor:
        """This tensor in host memory (itself if it is there already)."""
        return self.to("cpu")

    def cuda(self) -> Tensor:
        """This tensor on the ``"cuda"`` device (needs a backend such as onemodel-cupy)."""
        return self.to("cuda")

    def contiguous(self) -> Tensor:
        """Every tensor is laid out contiguously for ops; returns ``self`` as PyTorch does."""
        return self

    # reductions -------------------------------------------------------------------------------
    def sum(self, axis=None, keepdims: bool = False):
        return _reduce("ReduceSum", self, axis, keepdims)

    def mean(self, axis=None, keepdims: bool = False):
        return _reduce("ReduceMean", self, axis, keepdims)

    def max(self, axis=None, keepdims: bool = False):
        return _reduce("ReduceMax", self, axis, keepdims)

    def min(self, axis=None, keepdims: bool = False):
        return _reduce("ReduceMin", self, axis, keepdims)

    def var(self, axis=None, keepdims: bool = False, correction: int = 1):
        """Variance; ``correction=1`` (PyTorch's default) divides by N - 1, ``0`` by N."""
        mean = self.mean(axis, keepdims=True)
        sq = (self - mean) ** 2
        n = self.numel() // max(sq.sum(axis, keepdims=True).numel(), 1)
        return sq.sum(axis, keepdims=keepdims) / max(n - correction, 0)

    def std(self, axis=None, keepdims: bool = False, correction: int = 1):
        return self.var(axis, keepdims, correction).sqrt()

    def argmax(self, axis=None, keepdims: bool = False):
        return _arg("ArgMax", self, axis, keepdims)

    def argmin(self, axis=None, keepdims: bool = False):
        return _arg("ArgMin", self, axis, keepdims)

    def any(self, axis=None, keepdims: bool = False) -> Tensor:
        """Whether any element is nonzero (NaN counts), over ``axis`` (all by default): BOOL,
        built from Cast and ReduceMax so it traces."""
        return _any_all("ReduceMax", self, axis, keepdims)

    def all(self, axis=None, keepdims: bool = False) -> Tensor:
        """Whether every element is nonzero, over ``axis`` (all by default): BOOL."""
        return _any_all("ReduceMin", self, axis, keepdims)

    # PyTorch's selection and ordering methods ------------------------------------------------------
    def gather(self, axis: int, index) -> Tensor:
        """PyTorch's ``gather(dim, index)``: ``out[i][j] = self[index[i][j]][j]`` for ``dim=0``
        (ONNX GatherElements); ``index`` may be shorter than ``self`` on the other axes, as in
        PyTorch. Differentiable in ``self``."""
        index = _index_tensor(index, "gather")
        nd = self.ndim
        if index.ndim != nd:
            raise ShapeError(f"gather: index has rank {index.ndim}, the tensor {nd}; they must "
                             "match")
        a = _axis(axis, nd, "gather")
        x = self
        cut = tuple(slice(None) if i == a or index.shape[i] == x.shape[i]
                    else slice(0, index.shape[i]) for i in range(nd))
        if any(s != slice(None) for s in cut):
            x = x[cut]
        return dispatch("GatherElements", (x, index), {"axis": a})

    def topk(self, k: int, axis: int = -1, largest: bool = True, sorted: bool = True):
        """The ``k`` largest (or smallest) elements along ``axis`` and their positions:
        ``(values, indices)`` as PyTorch returns them (ONNX TopK; ties keep the lower index).
        Differentiable in the values."""
        a = _axis(axis, self.ndim, "topk")
        n = self.shape[a] if self.ndim else 1
        if isinstance(n, (int, np.integer)) and not 0 <= int(k) <= n:
            raise ShapeError(f"topk: k={k} is outside [0, {n}] for axis {axis} of shape "
                             f"{list(self.shape)}")
        x = self if self.ndim else self.reshape(1)
        values, indices = dispatch("TopK", (x, _const([int(k)])),
                                   {"axis": a, "largest": int(largest), "sorted": 1})
        if not self.ndim:
            values, indices = values.reshape(), indices.reshape()
        return SortResult(values, indices)

    def sort(self, axis: int = -1, descending: bool = False, stable: bool = False):
        """``(values, indices)`` sorted along ``axis``; equal elements keep their order (always
        stable). A TopK over the whole axis, so the values have a gradient."""
        a = _axis(axis, self.ndim, "sort")
        n = self.shape[a] if self.ndim else 1
        if not isinstance(n, (int, np.integer)):
            trace_state.refuse("sort along a symbolic axis", "TopK needs its k as a constant",
                               "sort along an axis of fixed size")
        return self.topk(int(n), a if self.ndim else -1, largest=descending)

    def argsort(self, axis: int = -1, descending: bool = False, stable: bool = False) -> Tensor:
        """The positions that sort ``axis`` (I64); stable, as :meth:`sort`."""
        return self.sort(axis, descending, stable).indices

    def roll(self, shifts, dims=None) -> Tensor:
        """PyTorch's ``roll``: elements shifted along ``dims`` (the flattened tensor without
        them), those that fall off the end coming back at the start: two Slices and a Concat per
        axis, so it has a gradient and traces for fixed sizes of the rolled axes."""
        if dims is None:
            if isinstance(shifts, (tuple, list)):
                if len(shifts) != 1:
                    raise OneModelError("roll: without dims, shifts is one number")
                shifts = shifts[0]
            return self.reshape(-1).roll(shifts, 0).reshape(*self.shape)
        shifts = list(shifts) if isinstance(shifts, (tuple, list)) else [shifts]
        dims = list(dims) if isinstance(dims, (tuple, list)) else [dims]
        if len(shifts) != len(dims):
            raise OneModelError(f"roll: {len(shifts)} shifts for {len(dims)} dims; give one "
                                "shift per dim")
        x = self
        for shift, d in zip(shifts, dims):
            a = _axis(d, x.ndim, "roll")
            n = x.shape[a]
            if not isinstance(n, (int, np.integer)):
                trace_state.refuse("roll along a symbolic axis", "the split point depends on "
                                   "the length", "roll along an axis of fixed size")
            s = int(shift) % n if n else 0
            if not s:
                continue
            head = tuple(slice(None) if i != a else slice(n - s, None) for i in range(x.ndim))
            tail = tuple(slice(None) if i != a else slice(0, n - s) for i in range(x.ndim))
            x = concat([x[head], x[tail]], axis=a)
        return x

    # DLPack: zero-copy exchange with numpy, PyTorch, JAX, CuPy ... ---------------------------------
    def __dlpack__(self, *args, **kwargs):
        """Export the data without copying (the DLPack protocol); the consumer (for instance
        ``torch.from_dlpack(t)`` or ``np.from_dlpack(t)``) shares this tensor's memory."""
        try:
            return self._data.__dlpack__(*args, **kwargs)
        except (BufferError, TypeError, ValueError, RuntimeError) as exc:
            raise OneModelError(f"__dlpack__: cannot export a {self.dtype.name} tensor of shape "
                                f"{list(self.shape)}: {exc}") from None

    def __dlpack_device__(self):
        return self._data.__dlpack_device__()

    @classmethod
    def from_dlpack(cls, source) -> Tensor:
        """A tensor sharing the memory of ``source`` (anything with ``__dlpack__``: a torch
        tensor, a numpy or JAX array, another Tensor): writes to one show in the other."""
        if isinstance(source, Tensor):
            return cls._wrap(source._data)
        if not hasattr(source, "__dlpack__"):
            raise OneModelError(f"from_dlpack expects an object with __dlpack__ (a torch "
                                f"tensor, a numpy array, ...), got {type(source).__name__}")
        try:
            arr = np.from_dlpack(source)
        except (BufferError, TypeError, ValueError, RuntimeError) as exc:
            hint = (" (a torch tensor that requires grad: pass t.detach())"
                    if getattr(source, "requires_grad", False) else "")
            raise OneModelError(f"from_dlpack: cannot import a {type(source).__name__}{hint}: "
                                f"{exc}") from None
        DType.from_numpy(arr.dtype)
        return cls._wrap(arr)

    # shapes -----------------------------------------------------------------------------------
    def reshape(self, *shape):
        return _call("Reshape", self, trace_state.shape_operand(_dims(shape), of=self))

    view = reshape

    def flatten(self, start_dim: int = 0, end_dim: int = -1):
        nd = self.ndim
        if nd == 0:
            return self.reshape(1)
        s, e = start_dim % nd, end_dim % nd
        if s > e:
            raise ShapeError(f"flatten: start_dim {start_dim} is after end_dim {end_dim}")
        dims = self.shape
        return self.reshape(*dims[:s], math.prod(dims[s : e + 1]), *dims[e + 1 :])

    def transpose(self, dim0: int = -2, dim1: int = -1):
        nd = self.ndim
        perm = list(range(nd))
        a, b = dim0 % nd, dim1 % nd
        perm[a], perm[b] = perm[b], perm[a]
        return _call("Transpose", self, perm=tuple(perm))

    def permute(self, *dims):
        return _call("Transpose", self, perm=tuple(int(d) for d in _shape_tuple(dims)))

    @property
    def T(self):
        return _call("Transpose", self, perm=tuple(reversed(range(self.ndim))))

    @property
    def mT(self):
        return self.transpose(-2, -1)

    def squeeze(self, axis=None):
        if axis is None:
            return _call("Squeeze", self)
        axes = (axis,) if isinstance(axis, int) else tuple(axis)
        return _call("Squeeze", self, _const(axes))

    def unsqueeze(self, axis):
        axes = (axis,) if isinstance(axis, int) else tuple(axis)
        return _call("Unsqueeze", self, _const(axes))

    def expand(self, *shape):
        dims = list(_dims(shape))
        off = len(dims) - self.ndim
        for i, d in enumerate(dims):
            if d == -1:
                if i < off:
                    raise ShapeError("expand: -1 is not allowed for a new leading axis")
                dims[i] = self.shape[i - off]
        return _call("Expand", self, trace_state.shape_operand(dims, of=self))

    def expand_as(self, other: Tensor):
        return self.expand(*other.shape)

    def split(self, split_size_or_sections, axis: int = 0):
        return split(self, split_size_or_sections, axis)

    def chunk(self, chunks: int, axis: int = 0):
        out = _call("Split", self, axis=axis, num_outputs=chunks)
        return out if isinstance(out, tuple) else (out,)

    def unbind(self, axis: int = 0) -> tuple[Tensor, ...]:
        """The slices along ``axis``, each without that axis."""
        return tuple(t.squeeze(axis) for t in split(self, 1, axis))

    def repeat(self, *sizes) -> Tensor:
        """PyTorch's ``repeat`` (numpy's ``tile``): Unsqueeze, Expand, Reshape, so gradients sum
        over the copies; extra leading sizes add axes."""
        reps = [int(r) for r in _dims(sizes)]
        if len(reps) < self.ndim:
            raise ShapeError(f"repeat: {len(reps)} sizes for a tensor of rank {self.ndim}; "
                             "give one per axis")
        x = self.reshape(*([1] * (len(reps) - self.ndim)), *self.shape)
        nd = x.ndim
        inter = x.reshape(*[d for dim in x.shape for d in (1, dim)])
        dims = [d for r, dim in zip(reps, x.shape) for d in (r, dim)]
        return inter.expand(*dims).reshape(*[r * dim for r, dim in zip(reps, x.shape)]) \
            if nd else x

    def flip(self, *args, dims=None) -> Tensor:
        """Reverse the order along each axis in ``dims`` (a Slice with step -1 per axis)."""
        axes = [int(d) % max(self.ndim, 1) for d in (_dims(args) if dims is None else dims)]
        index = tuple(slice(None, None, -1) if i in axes else slice(None)
                      for i in range(self.ndim))
        return self[index]

    # indexing ---------------------------------------------------------------------------------
    def __getitem__(self, index):
        from .indexing import getitem

        return getitem(self, index)

    def __setitem__(self, index, value):
        from .indexing import numpy_index

        self._check_inplace("__setitem__")
        self._data[numpy_index(index)] = _as_array(value, self)

    # in place (for eager code such as optimizers) -----------------------------------------------
    def _check_inplace(self, what: str) -> None:
        if self.requires_grad and self._node is None and _grad_enabled():
            raise AutogradError(
                f"{what} on a leaf tensor that requires grad would be lost by autograd; "
                "do it under `with no_grad():` (as optimizers do) or on a detached copy"
            )
        if self._node is not None and _grad_enabled():
            raise AutogradError(
                f"{what} on a tensor that is part of a gradient graph is not supported; "
                "write x = x + y instead of changing x in place"
            )

    def _inplace(self, what: str, ufunc, other) -> Tensor:
        self._check_inplace(what)
        ufunc(self._data, _as_array(other, self), out=self._data, casting="unsafe")
        return self

    def add_(self, other, alpha=1):
        return self._inplace("add_", np.add, other if alpha == 1 else _as_array(other, self) * alpha)

    def sub_(self, other, alpha=1):
        return self._inplace("sub_", np.subtract,
                             other if alpha == 1 else _as_array(other, self) * alpha)

    def mul_(self, other):
        return self._inplace("mul_", np.multiply, other)

    def div_(self, other):
        return self._inplace("div_", np.true_divide, other)

    def fill_(self, value):
        self._check_inplace("fill_")
        self._data[...] = value
        return self

    def zero_(self):
        return self.fill_(0)

    def copy_(self, src):
        self._check_inplace("copy_")
        self._data[...] = _as_array(src, self)
        return self

    def __iadd__(self, other):
        return self.add_(other)

    def __isub__(self, other):
        return self.sub_(other)

    def __imul__(self, other):
        return self.mul_(other)

    def __itruediv__(self, other):
        return self.div_(other)


# helpers -----------------------------------------------------------------------------------------

def _grad_enabled() -> bool:
    from .autograd import grad_mode

    return grad_mode.enabled


def _dims(shape) -> tuple:
    """Dims given as ``f(2, 3)`` or ``f((2, 3))``, kept as given (SymInts stay symbolic)."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = shape[0]
    return tuple(shape)


def _shape_tuple(shape) -> tuple[int, ...]:
    """Concrete dims for creating a tensor; a symbolic size cannot be frozen into a constant."""
    dims = _dims(shape)
    if any(isinstance(d, SymInt) for d in dims):
        trace_state.refuse("creating a tensor with a symbolic size",
                           "its size would be frozen to the example's",
                           "build it from a traced tensor instead (x * 0, or x.expand(...))")
    return tuple(int(d) for d in dims)


def _split_dtype(args, dtype) -> tuple[tuple, DType]:
    """``(DType.F32, 4, 1)`` or ``(4, 1)`` or ``((4, 1),)`` -> (the dims as given, the dtype)."""
    if args and isinstance(args[0], (DType, str)):
        dtype, args = args[0], args[1:]
    return _dims(args), (DType.F32 if dtype is None else DType.of(dtype))


def _const(values) -> Tensor:
    return Tensor._wrap(_ints(values))


def _as_array(value, like: Tensor) -> np.ndarray:
    if isinstance(value, Tensor):
        if value._device != like._device and value.ndim:
            raise devices.DeviceError(f"a tensor on device {value._device!r} cannot update one on "
                                      f"device {like._device!r}; move it with .to() first")
        return value._data if value._device == like._device else value._host()[()]
    arr = np.asarray(value, dtype=like._data.dtype)
    if like._device == "cpu":
        return arr
    # another device takes scalars as numpy scalars and arrays in its own memory
    return arr[()] if arr.ndim == 0 else devices.to_device(arr, like._device)


def _scalar_like(value, like: Tensor) -> Tensor:
    if isinstance(value, Tensor):
        return value if value._data.dtype == like._data.dtype else value.cast(like.dtype)
    return Tensor._wrap(np.asarray(value, dtype=like._data.dtype))


def _binary(op: str, a, b):
    """Promote operands as PyTorch does and dispatch: a Python scalar takes the tensor's dtype
    (or F32 for a float with an integer tensor); two tensors promote as numpy does."""
    if not isinstance(a, Tensor):
        a = _operand(a, b)
        if a._data.dtype != b._data.dtype:
            return dispatch(op, (a, b.cast(a.dtype)))
    elif not isinstance(b, Tensor):
        b = _operand(b, a)
        if a._data.dtype != b._data.dtype:
            return dispatch(op, (a.cast(b.dtype), b))
    elif a._data.dtype != b._data.dtype:
        dt = result_dtype(a.dtype, b.dtype)
        a, b = a.cast(dt), b.cast(dt)
    return dispatch_binary(op, a, b)


def _operand(value, other: Tensor) -> Tensor:
    """A non-tensor operand as a tensor: Python scalars adopt ``other``'s dtype unless that loses
    their kind (a float with an int tensor gives F32, an int with a BOOL tensor gives I64)."""
    if isinstance(value, np.ndarray):
        return Tensor.from_numpy(value)
    dt = other._data.dtype
    if isinstance(value, SymInt) and trace_state.active is not None:
        return trace_state.active.scalar_operand(value, dt)
    if isinstance(value, bool):
        pass
    elif isinstance(value, float) and dt.kind in "iub":
        dt = np.dtype(np.float32)
    elif isinstance(value, int) and dt.kind == "b":
        dt = _I64
    return Tensor._wrap(np.asarray(value, dtype=dt))


def _call(op: str, *inputs, **attrs):
    return dispatch(op, inputs, attrs)


def _reduce(op: str, x: Tensor, axis, keepdims: bool):
    if axis is None:
        return dispatch(op, (x,), {"keepdims": int(keepdims)})
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    return dispatch(op, (x, _const(axes)), {"keepdims": int(keepdims)})


def _arg(op: str, x: Tensor, axis, keepdims: bool):
    if axis is None:
        return dispatch(op, (x.reshape(-1),), {"axis": 0, "keepdims": int(keepdims)})
    return dispatch(op, (x,), {"axis": int(axis), "keepdims": int(keepdims)})


class SortResult(tuple):
    """``(values, indices)`` of :meth:`Tensor.topk` and :meth:`Tensor.sort`, also by name as in
    PyTorch (``x.sort().indices``)."""

    __slots__ = ()

    def __new__(cls, values: Tensor, indices: Tensor):
        return super().__new__(cls, (values, indices))

    @property
    def values(self) -> Tensor:
        return self[0]

    @property
    def indices(self) -> Tensor:
        return self[1]


def _axis(axis, nd: int, what: str) -> int:
    n = max(nd, 1)
    if not -n <= int(axis) < n:
        raise ShapeError(f"{what}: axis {axis} is out of range for a tensor of rank {nd}")
    return int(axis) % n


def _index_tensor(index, what: str) -> Tensor:
    if not isinstance(index, Tensor):
        index = Tensor._wrap(np.asarray(index))
    if index.dtype not in (DType.I64, DType.I32):
        raise OneModelError(f"{what}: the index must hold integers, got {index.dtype.name}")
    return index if index.dtype is DType.I64 else index.cast(DType.I64)


def _any_all(op: str, x: Tensor, axis, keepdims: bool) -> Tensor:
    flags = x if x.dtype is DType.BOOL else x.cast(DType.BOOL)
    if not x._traced and x._data.size == 0:  # reductions of nothing: any False, all True
        keep = np.asarray(x._data != 0)
        fn = np.any if op == "ReduceMax" else np.all
        return Tensor._wrap(np.asarray(fn(keep, axis=None if axis is None else
                                          (axis if isinstance(axis, int) else tuple(axis)),
                                          keepdims=keepdims)))
    return _reduce(op, flags.cast(DType.I32), axis, keepdims).cast(DType.BOOL)


# functions that take several tensors --------------------------------------------------------------

def where(condition, x, y) -> Tensor:
    """Elementwise ``condition ? x : y`` with broadcasting."""
    if not isinstance(condition, Tensor):
        condition = Tensor._wrap(np.asarray(condition, dtype=bool))
    if not isinstance(x, Tensor) and not isinstance(y, Tensor):
        raise OneModelError("where: x or y must be a Tensor")
    if not isinstance(x, Tensor):
        x = _operand(x, y)
    if not isinstance(y, Tensor):
        y = _operand(y, x)
    if x._data.dtype != y._data.dtype:
        dt = result_dtype(x.dtype, y.dtype)
        x, y = x.cast(dt), y.cast(dt)
    return dispatch("Where", (condition, x, y))


def concat(tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
    """Join tensors along an existing axis."""
    tensors = list(tensors)
    if not tensors:
        raise OneModelError("concat needs at least one tensor")
    dt = result_dtype(*[t.dtype for t in tensors])
    return dispatch("Concat", tuple(t.cast(dt) for t in tensors), {"axis": int(axis)})


cat = concat


def stack(tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
    """Join tensors along a new axis."""
    tensors = list(tensors)
    if not tensors:
        raise OneModelError("stack needs at least one tensor")
    nd = tensors[0].ndim + 1
    ax = axis % nd
    return concat([t.unsqueeze(ax) for t in tensors], ax)


def split(x: Tensor, split_size_or_sections, axis: int = 0) -> tuple[Tensor, ...]:
    """PyTorch's split: an int is the size of each piece (the last may be smaller), a list the
    size of every piece."""
    n = x.shape[axis]
    if isinstance(split_size_or_sections, int):
        size = split_size_or_sections
        sections = [size] * (n // size) + ([n % size] if n % size else [])
    else:
        sections = [int(s) for s in split_size_or_sections]
    if sum(sections) != n:
        raise ShapeError(f"split: sections {sections} do not add up to axis {axis} size {n}")
    out = dispatch("Split", (x, trace_state.shape_operand(sections, of=x)), {"axis": int(axis)})
    return out if isinstance(out, tuple) else (out,)


def zeros_like(t: Tensor) -> Tensor:
    return Tensor._wrap(np.zeros_like(t._data))


def ones_like(t: Tensor) -> Tensor:
    return Tensor._wrap(np.ones_like(t._data))


def tensor(data: Any, dtype=None, requires_grad: bool = False) -> Tensor:
    """Build a tensor from nested data; Python floats become F32, ints I64."""
    return Tensor(data, dtype=dtype, requires_grad=requires_grad)


def _extreme(a: Tensor, b, strict, loose) -> Tensor:
    """max/min from Where: the mean of the strict and the loose choice is the same value, and
    splits the gradient evenly where ``a`` and ``b`` tie."""
    b = b if isinstance(b, Tensor) else _scalar_like(b, a)
    return (where(strict(a, b), a, b) + where(loose(a, b), a, b)) * 0.5


def _is_dtype_name(text: str) -> bool:
    try:
        DType.of(text)
    except (OneModelError, KeyError, ValueError, TypeError):
        return False
    return True


def _move(t: Tensor, device: str) -> Tensor:
    """``t`` copied to ``device``; the gradient of the copy moves back to ``t``'s device."""
    out = Tensor._wrap(devices.move(t._data, t._device, device), device)
    if t.requires_grad and _grad_enabled():
        from .autograd import Node

        out.requires_grad = True
        out._node = Node(_MOVE, (t,), {"device": device}, (out,))
    return out


def _move_grad(ctx, g):
    return (g.to(ctx.inputs[0].device),)


# the device copy's place on the gradient tape: not an op of the op set (no graph holds it)
_MOVE = OpDef("DeviceCopy", kernel=None, shape_rule=lambda specs, **a: specs[0], grad=_move_grad,
              inputs=("input",), optional=frozenset(), variadic=False, attrs={"device": "cpu"},
              outputs=("output",), domain="onemodel", traceable=False)


# PyTorch's dim/keepdim next to axis/keepdims, for every method and these functions (one place)
accept_torch_names(Tensor)
accept_torch_names(sys.modules[__name__], ["concat", "stack", "split"])
cat = concat

from .dispatch import dispatch, dispatch_binary  # noqa: E402 - dispatch needs Tensor defined first
