"""Values that are not tensors: sequences of tensors and optionals, and the ops over them.

At run time a *sequence* is a Python ``list`` of numpy arrays, and an *optional* is its value
itself, or ``None`` when it is empty (so an omitted optional input and an empty optional are
the same thing). While a graph is checked or planned they are described by
:class:`SequenceSpec` and :class:`OptionalSpec`; their ``shape`` is ``(None,)``, which no
tensor shape can be, so code written for tensors (constant folding, size checks) never
mistakes one for a tensor. Ops that accept such values carry ``accepts_values = True``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..dtype import DType
from ..errors import OneModelError, ShapeError
from ..symbolic import Dim, DimExpr, format_shape
from .base import OPS, TensorSpec, UnknownValueError, defop, norm_axis
from .dynamic import fresh_dim


@dataclass(frozen=True)
class SequenceSpec:
    """A sequence of tensors of one dtype. ``elems``: each element's spec when they are known
    (a sequence built from known tensors), else None (a length decided at run time)."""

    dtype: DType | None
    elems: tuple[TensorSpec, ...] | None = field(default=None)
    value = None
    kind = "sequence"

    @property
    def shape(self) -> tuple:
        return (None,)

    def __str__(self) -> str:
        inner = self.dtype.name if self.dtype is not None else "?"
        if self.elems is None:
            return f"seq<{inner}>"
        return f"seq<{inner}>[{', '.join(format_shape(e.shape) for e in self.elems)}]"


@dataclass(frozen=True)
class OptionalSpec:
    """An optional value: ``inner`` describes the value it holds (tensor or sequence; None when
    not known), ``present`` whether it holds one (None: decided at run time)."""

    inner: TensorSpec | SequenceSpec | None
    present: bool | None = None
    value = None
    kind = "optional"

    @property
    def shape(self) -> tuple:
        return (None,)

    @property
    def dtype(self) -> DType | None:
        return None if self.inner is None else self.inner.dtype

    def __str__(self) -> str:
        return f"optional<{self.inner if self.inner is not None else '?'}>"


def is_tensor_spec(spec) -> bool:
    return isinstance(spec, TensorSpec)


def spec_of_value(value) -> TensorSpec | SequenceSpec | None:
    """The exact spec of a run-time value (an array, a list of arrays); None for ``None``."""
    if value is None:
        return None
    if isinstance(value, list):
        elems = tuple(spec_of_value(v) for v in value)
        dtype = elems[0].dtype if elems else None
        return SequenceSpec(dtype, elems)
    arr = np.asarray(value)
    return TensorSpec(tuple(arr.shape), DType.from_numpy(arr.dtype))


def merge_specs(a, b):
    """A spec that describes values of both ``a`` and ``b`` (two branches' outputs, a loop
    value before and after an iteration): equal extents stay, differing ones get a fresh
    symbol. UnknownValueError when even the rank differs."""
    if a == b:
        return a
    if isinstance(a, TensorSpec) and isinstance(b, TensorSpec):
        if a.dtype is not b.dtype:
            raise ShapeError(f"a value is {a.dtype.name} on one path and {b.dtype.name} on "
                             "another")
        if len(a.shape) != len(b.shape):
            raise UnknownValueError(f"a value has rank {len(a.shape)} on one path and "
                                    f"{len(b.shape)} on another")
        return TensorSpec(tuple(x if _same(x, y) else fresh_dim("merge")
                                for x, y in zip(a.shape, b.shape)), a.dtype)
    if isinstance(a, SequenceSpec) and isinstance(b, SequenceSpec):
        dtype = a.dtype if a.dtype is not None else b.dtype
        if a.dtype is not None and b.dtype is not None and a.dtype is not b.dtype:
            raise ShapeError(f"a sequence holds {a.dtype.name} on one path and "
                             f"{b.dtype.name} on another")
        return SequenceSpec(dtype, None)
    if isinstance(a, OptionalSpec) or isinstance(b, OptionalSpec):
        ia = a.inner if isinstance(a, OptionalSpec) else a
        ib = b.inner if isinstance(b, OptionalSpec) else b
        inner = ia if ib is None else ib if ia is None else merge_specs(ia, ib)
        return OptionalSpec(inner, None)
    raise ShapeError(f"a value is {a} on one path and {b} on another")


def _same(x: Dim, y: Dim) -> bool:
    if isinstance(x, DimExpr) or isinstance(y, DimExpr):
        return x == y
    return int(x) == int(y)


def _accepts_values(op):
    op.accepts_values = True
    return op


def _seq(spec, what: str) -> SequenceSpec:
    if not isinstance(spec, SequenceSpec):
        raise ShapeError(f"{what} must be a sequence, got {spec}")
    return spec


def _tensor(spec, what: str) -> TensorSpec:
    if not isinstance(spec, TensorSpec):
        raise ShapeError(f"{what} must be a tensor, got {spec}")
    return spec


def _scalar_value(spec) -> int | None:
    """The value of a 0-d or 1-element integer input when the rule can see it."""
    if spec is None or spec.value is None or len(spec.value) != 1:
        return None
    v = spec.value[0]
    return v if isinstance(v, int) else None


def _position(seq: list, position, what: str, *, insert: bool = False) -> int:
    n = len(seq)
    p = int(np.asarray(position).reshape(-1)[0])
    hi = n if insert else n - 1
    if not -n <= p <= hi:
        raise OneModelError(f"{what}: position {p} is out of range for a sequence of length {n}")
    return p + n if p < 0 else p


def _dtype_attr(dtype):
    if dtype is None:
        return DType.F32
    if isinstance(dtype, DType):
        return dtype
    raise ShapeError(f"dtype must be a DType, got {dtype!r}")


# building --------------------------------------------------------------------------------------

@_accepts_values
@defop("SequenceEmpty", shape=lambda specs, *, dtype=None: SequenceSpec(_dtype_attr(dtype), ()))
def sequence_empty(*, dtype=None):
    """An empty sequence of tensors of ``dtype`` (default F32)."""
    return []


def _construct_shape(specs):
    elems = tuple(_tensor(s, "every input of SequenceConstruct") for s in specs)
    dts = {e.dtype for e in elems}
    if len(dts) > 1:
        raise ShapeError("the tensors of a sequence must share one dtype, got "
                         + ", ".join(sorted(d.name for d in dts)))
    return SequenceSpec(elems[0].dtype, elems)


@_accepts_values
@defop("SequenceConstruct", shape=_construct_shape)
def sequence_construct(*inputs):
    """A sequence of the input tensors, in order."""
    return [np.array(x, copy=True) for x in inputs]


def _insert_shape(specs):
    seq = _seq(specs[0], "input_sequence")
    t = _tensor(specs[1], "tensor")
    if seq.dtype is not None and t.dtype is not seq.dtype:
        raise ShapeError(f"cannot insert a {t.dtype.name} tensor into a sequence of "
                         f"{seq.dtype.name}")
    elems = None
    if seq.elems is not None:
        pos = len(seq.elems) if len(specs) < 3 or specs[2] is None else _scalar_value(specs[2])
        if pos is not None and -len(seq.elems) <= pos <= len(seq.elems):
            pos = pos + len(seq.elems) if pos < 0 else pos
            elems = seq.elems[:pos] + (TensorSpec(t.shape, t.dtype),) + seq.elems[pos:]
    return SequenceSpec(t.dtype, elems)


@_accepts_values
@defop("SequenceInsert", shape=_insert_shape)
def sequence_insert(input_sequence, tensor, position=None):
    """The sequence with ``tensor`` inserted at ``position`` (default: at the end)."""
    out = list(input_sequence)
    p = len(out) if position is None else _position(out, position, "SequenceInsert",
                                                     insert=True)
    out.insert(p, np.array(tensor, copy=True))
    return out


def _erase_shape(specs):
    seq = _seq(specs[0], "input_sequence")
    elems = None
    if seq.elems is not None and seq.elems:
        pos = -1 if len(specs) < 2 or specs[1] is None else _scalar_value(specs[1])
        if pos is not None and -len(seq.elems) <= pos < len(seq.elems):
            pos = pos + len(seq.elems) if pos < 0 else pos
            elems = seq.elems[:pos] + seq.elems[pos + 1:]
    return SequenceSpec(seq.dtype, elems)


@_accepts_values
@defop("SequenceErase", shape=_erase_shape)
def sequence_erase(input_sequence, position=None):
    """The sequence without the element at ``position`` (default: the last)."""
    out = list(input_sequence)
    if not out:
        raise OneModelError("SequenceErase: the sequence is empty")
    p = len(out) - 1 if position is None else _position(out, position, "SequenceErase")
    del out[p]
    return out


# reading ---------------------------------------------------------------------------------------

def _at_shape(specs):
    seq = _seq(specs[0], "input_sequence")
    if seq.elems is not None:
        pos = _scalar_value(specs[1])
        if pos is not None and -len(seq.elems) <= pos < len(seq.elems):
            return seq.elems[pos]
        shapes = {e.shape for e in seq.elems}
        if len(shapes) == 1:
            return seq.elems[0]
        ranks = {len(s) for s in shapes}
        if len(ranks) == 1:
            out = seq.elems[0]
            for e in seq.elems[1:]:
                out = merge_specs(out, e)
            return out
    raise UnknownValueError("the shape of a sequence element is known only at run time")


@_accepts_values
@defop("SequenceAt", shape=_at_shape)
def sequence_at(input_sequence, position):
    """The element at ``position`` (negative counts from the end)."""
    return np.array(input_sequence[_position(input_sequence, position, "SequenceAt")], copy=True)


def _length_shape(specs):
    seq = _seq(specs[0], "input_sequence")
    value = None if seq.elems is None else (len(seq.elems),)
    return TensorSpec((), DType.I64, value)


@_accepts_values
@defop("SequenceLength", shape=_length_shape)
def sequence_length(input_sequence):
    """The number of tensors in the sequence, as a 0-d I64 tensor."""
    return np.array(len(input_sequence), np.int64)


def _split_to_sequence_shape(specs, *, axis=0, keepdims=1):
    x = _tensor(specs[0], "input")
    a = norm_axis(axis, len(x.shape))
    split = specs[1] if len(specs) > 1 else None
    dim = x.shape[a]
    sizes = None
    if split is None:
        if isinstance(dim, int):
            sizes = [1] * dim
    elif split.value is not None and all(isinstance(v, int) for v in split.value):
        if len(split.shape) == 0:
            n = split.value[0]
            if isinstance(dim, int) and n > 0:
                sizes = [n] * (dim // n) + ([dim % n] if dim % n else [])
        else:
            sizes = list(split.value)
    if sizes is None:
        return SequenceSpec(x.dtype, None)
    drop = split is None and not keepdims
    elems = []
    for s in sizes:
        shape = list(x.shape)
        if drop:
            del shape[a]
        else:
            shape[a] = s
        elems.append(TensorSpec(tuple(shape), x.dtype))
    return SequenceSpec(x.dtype, tuple(elems))


@_accepts_values
@defop("SplitToSequence", shape=_split_to_sequence_shape)
def split_to_sequence(input, split=None, *, axis=0, keepdims=1):
    """``input`` split along ``axis`` into a sequence: in pieces of 1 (dropping the axis unless
    ``keepdims``), in pieces of a 0-d ``split`` (the last may be shorter), or of the sizes in a
    1-D ``split``."""
    a = axis % input.ndim
    dim = input.shape[a]
    if split is None:
        parts = np.split(input, dim, axis=a)
        if not keepdims:
            parts = [np.squeeze(p, axis=a) for p in parts]
        return [np.array(p, copy=True) for p in parts]
    split = np.asarray(split)
    if split.ndim == 0:
        n = int(split)
        if n <= 0:
            raise OneModelError(f"SplitToSequence: the split size must be positive, got {n}")
        cuts = list(range(n, dim, n))
    else:
        sizes = [int(s) for s in split.reshape(-1)]
        if sum(sizes) != dim or any(s < 0 for s in sizes):
            raise OneModelError(f"SplitToSequence: split sizes {sizes} do not add up to the "
                                f"axis length {dim}")
        cuts = list(np.cumsum(sizes)[:-1])
    return [np.array(p, copy=True) for p in np.split(input, cuts, axis=a)]


def _concat_from_sequence_shape(specs, *, axis=0, new_axis=0):
    seq = _seq(specs[0], "input_sequence")
    if seq.elems is None or not seq.elems:
        raise UnknownValueError("the sequence's elements are known only at run time")
    first = seq.elems[0]
    rank = len(first.shape) + (1 if new_axis else 0)
    a = norm_axis(axis, rank)
    if new_axis:
        shape = list(first.shape)
        for e in seq.elems[1:]:
            if len(e.shape) != len(shape) or any(not _same(x, y) for x, y in
                                                 zip(e.shape, shape)):
                raise ShapeError("stacking needs elements of one shape")
        shape.insert(a, len(seq.elems))
        return TensorSpec(tuple(shape), seq.dtype)
    total: Dim = 0
    for e in seq.elems:
        if len(e.shape) != len(first.shape):
            raise ShapeError("the elements of the sequence differ in rank")
        for i, (x, y) in enumerate(zip(e.shape, first.shape)):
            if i != a and not _same(x, y):
                raise ShapeError(f"the elements differ on axis {i}, not only on axis {a}")
        total = total + e.shape[a]
    shape = list(first.shape)
    shape[a] = total
    return TensorSpec(tuple(shape), seq.dtype)


@_accepts_values
@defop("ConcatFromSequence", shape=_concat_from_sequence_shape)
def concat_from_sequence(input_sequence, *, axis=0, new_axis=0):
    """The sequence's tensors joined along ``axis`` (stacked on a new axis with ``new_axis``)."""
    if not input_sequence:
        raise OneModelError("ConcatFromSequence: the sequence is empty")
    if new_axis:
        return np.stack(input_sequence, axis=axis)
    return np.concatenate(input_sequence, axis=axis)


# optionals -------------------------------------------------------------------------------------

def _optional_shape(specs, *, type=None):
    x = specs[0] if specs else None
    if x is None:
        return OptionalSpec(type, False)
    if isinstance(x, OptionalSpec):
        raise ShapeError("an optional cannot hold another optional")
    return OptionalSpec(x, True)


@_accepts_values
@defop("Optional", shape=_optional_shape)
def optional(input=None, *, type=None):
    """An optional holding ``input``, or an empty one (of ``type``) when it is omitted."""
    if input is None:
        return None
    return list(input) if isinstance(input, list) else np.array(input, copy=True)


def _has_element_shape(specs):
    x = specs[0] if specs else None
    value = None
    if x is None:
        value = (0,)
    elif not isinstance(x, OptionalSpec):
        value = (1,)
    elif x.present is not None:
        value = (int(x.present),)
    return TensorSpec((), DType.BOOL, value)


@_accepts_values
@defop("OptionalHasElement", shape=_has_element_shape)
def optional_has_element(input=None):
    """Whether the optional holds a value (false for an omitted input)."""
    return np.array(input is not None)


def _get_element_shape(specs):
    x = specs[0]
    if isinstance(x, OptionalSpec):
        if x.present is False:
            raise ShapeError("the optional is empty")
        if x.inner is None:
            raise UnknownValueError("the optional's value is known only at run time")
        return x.inner
    return x


@_accepts_values
@defop("OptionalGetElement", shape=_get_element_shape)
def optional_get_element(input):
    """The value an optional holds; an error when it is empty."""
    if input is None:
        raise OneModelError("OptionalGetElement: the optional is empty")
    return list(input) if isinstance(input, list) else np.array(input, copy=True)


def accepts_values(op_name: str) -> bool:
    """Whether op ``op_name`` takes sequences or optionals as inputs."""
    op = OPS.get(op_name)
    return bool(op is not None and getattr(op, "accepts_values", False))
