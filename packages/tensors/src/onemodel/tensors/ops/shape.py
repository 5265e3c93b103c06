"""Ops that move data without computing: Reshape, Transpose, Squeeze, Unsqueeze, Expand, Concat,
Split, Slice, Gather, Pad, Shape, OneHot, and the scatter ops their gradients use."""

from __future__ import annotations

import math

import numpy as np

from ..dtype import DType
from ..errors import ShapeError
from ..symbolic import Dim, DimExpr, add, dims_equal, floordiv, mul, numel
from ._grad import call, ints, unbroadcast
from .adapters import ImportNode, attribute_to_input, onnx_adapter
from .base import (
    TensorSpec,
    broadcast_shapes,
    const_ints,
    defop,
    first_value,
    norm_axis,
    same_dtype,
)
from .specialize import CallSite, specializer

# Reshape -------------------------------------------------------------------------------------


def reshape_target(in_shape, target, allowzero: int = 0) -> tuple[Dim, ...]:
    """ONNX Reshape's target: 0 copies the input dim (unless allowzero), one -1 is inferred."""
    out: list[Dim] = []
    infer_at = None
    for i, d in enumerate(target):
        if isinstance(d, (int, np.integer)) and int(d) == 0 and not allowzero:
            if i >= len(in_shape):
                raise ShapeError(f"target {list(target)} copies axis {i} that the input lacks")
            out.append(in_shape[i])
        elif isinstance(d, (int, np.integer)) and int(d) == -1:
            if infer_at is not None:
                raise ShapeError(f"target {list(target)} has more than one -1")
            infer_at = i
            out.append(-1)
        else:
            out.append(d if isinstance(d, DimExpr) else int(d))
    total = numel(in_shape)
    if infer_at is not None:
        known = numel([d for i, d in enumerate(out) if i != infer_at])
        if isinstance(total, int) and isinstance(known, int):
            if known == 0 or total % known:
                raise ShapeError(
                    f"cannot reshape {list(in_shape)} ({total} elements) to {list(target)}"
                )
            out[infer_at] = total // known
        else:
            out[infer_at] = floordiv(total, known)
    elif isinstance(total, int) and isinstance(numel(out), int) and numel(out) != total:
        raise ShapeError(f"cannot reshape {list(in_shape)} ({total} elements) to {list(target)}")
    return tuple(out)


def _reshape_shape(specs, *, allowzero=0):
    x = specs[0]
    target = const_ints(specs[1], "the Reshape target")
    return TensorSpec(reshape_target(x.shape, target, allowzero), x.dtype)


@defop("Reshape", symbolic_value=first_value, shape=_reshape_shape, static=("shape",),
       grad=lambda ctx, g: (g.reshape(*ctx.inputs[0].shape), None))
def reshape(data, shape, *, allowzero=0):
    target = shape.tolist()
    if allowzero or 0 not in target:
        return data.reshape(target)  # numpy's rule is ONNX's here (one -1 inferred)
    return data.reshape(reshape_target(data.shape, target, allowzero))


def _view_as_output(site: CallSite):
    """The specialized call of an op that only gives its input another shape (Reshape,
    Flatten, Squeeze, Unsqueeze) once its shape-setting inputs are constants: a reshape to
    the planned output shape."""
    if any(v is None for s, v in zip(site.shapes[1:], site.values[1:]) if s is not None):
        return None  # a target computed at run time: the generic kernel reads it
    src, target, generic = site.shapes[0], site.out_shapes[0], site.generic

    def view_as_output(data, *rest):
        if data.shape != src:
            return generic(data, *rest)
        return data.reshape(target)
    view_as_output.as_method = ("reshape", target, src)
    return view_as_output


specializer(reshape.kernel)(_view_as_output)


def _flatten_shape(specs, *, axis=1):
    x = specs[0]
    nd = len(x.shape)
    a = axis % nd if nd and axis < 0 else axis
    if not 0 <= a <= nd:
        raise ShapeError(f"Flatten axis {axis} is out of range for rank {nd}")
    return TensorSpec((numel(x.shape[:a]), numel(x.shape[a:])), x.dtype)


@defop("Flatten", shape=_flatten_shape,
       grad=lambda ctx, g: g.reshape(*ctx.inputs[0].shape))
def flatten(input, *, axis=1):
    """ONNX Flatten: a 2-D view, the axes before ``axis`` in the first dimension."""
    shape = input.shape
    a = axis % len(shape) if shape and axis < 0 else axis
    return input.reshape(math.prod(shape[:a]), math.prod(shape[a:]))


specializer(flatten.kernel)(_view_as_output)


# Transpose -----------------------------------------------------------------------------------

def _perm(ndim, perm):
    return tuple(reversed(range(ndim))) if perm is None else tuple(int(p) for p in perm)


def _transpose_shape(specs, *, perm=None):
    x = specs[0]
    p = _perm(len(x.shape), perm)
    if sorted(p) != list(range(len(x.shape))):
        raise ShapeError(f"perm {list(p)} is not a permutation of the {len(x.shape)} axes")
    return TensorSpec(tuple(x.shape[i] for i in p), x.dtype)


def _transpose_grad(ctx, g):
    p = _perm(ctx.inputs[0].ndim, ctx.attrs["perm"])
    return call("Transpose", g, perm=tuple(int(i) for i in np.argsort(p)))


@defop("Transpose", shape=_transpose_shape, grad=_transpose_grad)
def transpose(data, *, perm=None):
    return data.transpose() if perm is None else data.transpose(perm)


@specializer(transpose.kernel)
def _transpose_at(site: CallSite):
    perm = _perm(len(site.shapes[0]), site.attrs.get("perm"))

    def transposed(data):
        return data.transpose(perm)  # numpy checks the rank
    transposed.as_method = ("transpose", perm, None)
    return transposed


# Squeeze / Unsqueeze ---------------------------------------------------------------------------

def _squeeze_shape(specs):
    x = specs[0]
    axes = const_ints(specs[1] if len(specs) > 1 else None, "Squeeze axes")
    nd = len(x.shape)
    if axes is None:
        return TensorSpec(tuple(d for d in x.shape if not (isinstance(d, int) and d == 1)),
                          x.dtype)
    red = {norm_axis(int(a), nd) for a in axes}
    for a in red:
        if not (isinstance(x.shape[a], int) and x.shape[a] == 1):
            raise ShapeError(f"cannot squeeze axis {a} of size {x.shape[a]}")
    return TensorSpec(tuple(d for i, d in enumerate(x.shape) if i not in red), x.dtype)


@onnx_adapter("Squeeze", "Unsqueeze", before=13)
def _axes_attribute(node: ImportNode) -> None:
    """Opset < 13: ``axes`` was an attribute."""
    attribute_to_input(node, "axes", 1)


@defop("Squeeze", symbolic_value=first_value, shape=_squeeze_shape, static=("axes",),
       grad=lambda ctx, g: (g.reshape(*ctx.inputs[0].shape), None))
def squeeze(data, axes=None):
    if axes is None:
        return np.squeeze(data)
    return np.squeeze(data, axis=tuple(int(a) % data.ndim for a in axes))


specializer(squeeze.kernel)(_view_as_output)


def _unsqueeze_shape(specs):
    x = specs[0]
    axes = const_ints(specs[1], "Unsqueeze axes")
    nd = len(x.shape) + len(axes)
    pos = sorted(norm_axis(int(a), nd) for a in axes)
    if len(set(pos)) != len(pos):
        raise ShapeError(f"Unsqueeze axes {list(axes)} repeat an axis")
    out = list(x.shape)
    for a in pos:
        out.insert(a, 1)
    return TensorSpec(tuple(out), x.dtype)


@defop("Unsqueeze", symbolic_value=first_value, shape=_unsqueeze_shape, static=("axes",),
       grad=lambda ctx, g: (g.reshape(*ctx.inputs[0].shape), None))
def unsqueeze(data, axes):
    axes = np.asarray(axes).reshape(-1).tolist()  # a 0-d axes tensor (ONNX files have them)
    nd = data.ndim + len(axes)
    pos = sorted(a % nd for a in axes)
    if len(set(pos)) != len(pos):
        raise ShapeError(f"Unsqueeze axes {axes} repeat an axis")
    shape = list(data.shape)
    for a in pos:
        shape.insert(a, 1)
    return data.reshape(shape)  # a view, as np.expand_dims gives, without its checks' cost


specializer(unsqueeze.kernel)(_view_as_output)


# Expand --------------------------------------------------------------------------------------

def _expand_shape(specs):
    x = specs[0]
    target = const_ints(specs[1], "the Expand shape")
    return TensorSpec(broadcast_shapes(x.shape, target), x.dtype)


@defop("Expand", foldable=False, shape=_expand_shape, static=("shape",),
       grad=lambda ctx, g: (unbroadcast(g, ctx.inputs[0].shape), None))
def expand(input, shape):
    src, target = input.shape, tuple(shape.tolist())
    n = max(len(src), len(target))
    out = []
    for d, t in zip((1,) * (n - len(src)) + src, (1,) * (n - len(target)) + target):
        if d != t and d != 1 and t != 1:
            raise ShapeError(f"Expand: input shape {list(src)} does not broadcast to "
                             f"{list(target)}")
        out.append(d if t == 1 else t)
    out = tuple(out)
    if out == src:
        return input.view()
    if math.prod(out) <= 4096:  # small: a copy costs less than np.broadcast_to's set-up
        dst = np.empty(out, input.dtype)
        dst[...] = input
        return dst
    return np.broadcast_to(input, out)


@specializer(expand.kernel)
def _expand_at(site: CallSite):
    if site.values[1] is None:
        return None
    src, out, dtype, generic = site.shapes[0], site.out_shapes[0], site.dtypes[0], site.generic
    copy = out != src and math.prod(out) <= 4096  # the generic kernel's choice, made once

    def expand_to(input, shape):
        if input.shape != src:
            return generic(input, shape)
        if out == src:
            return input.view()
        if copy:
            dst = np.empty(out, dtype)
            dst[...] = input
            return dst
        return np.broadcast_to(input, out)
    return expand_to


# Concat / Split ------------------------------------------------------------------------------

def _may_equal(a: Dim, b: Dim) -> bool:
    """Equal, or symbolic sizes not proved different: those are checked when a plan binds real
    sizes (the shape rule then sees ints and refuses a mismatch, naming the node)."""
    if isinstance(a, DimExpr) or isinstance(b, DimExpr):
        return True
    return dims_equal(a, b)


def _concat_shape(specs, *, axis=0):
    dt = same_dtype(specs)
    first = specs[0].shape
    a = norm_axis(axis, len(first))
    total: Dim = 0
    for s in specs:
        if len(s.shape) != len(first) or any(
            i != a and not _may_equal(d, e) for i, (d, e) in enumerate(zip(s.shape, first))
        ):
            raise ShapeError(f"inputs must match except on axis {axis}, got "
                             f"{[list(t.shape) for t in specs]}")
        total = add(total, s.shape[a])
    return TensorSpec(first[:a] + (total,) + first[a + 1 :], dt)


def _concat_grad(ctx, g):
    a = ctx.attrs["axis"] % g.ndim
    sizes = [t.shape[a] for t in ctx.inputs]
    return call("Split", g, ints(sizes), axis=a) if len(sizes) > 1 else (g,)


def _concat_value(in_specs, values, attrs):
    return tuple(d for v in values if v is not None for d in v)


@defop("Concat", symbolic_value=_concat_value, shape=_concat_shape, grad=_concat_grad,
       writes_out=True)
def concat(*inputs, axis=0, out=None):
    # out: the planned buffer of exactly the output's shape and dtype (numpy fills all of it)
    return np.concatenate(inputs, axis=axis, out=out)


def _split_sizes(dim, split, num_outputs):
    if split is not None:
        return [int(s) for s in split]
    if num_outputs is None:
        raise ShapeError("Split needs the split input or the num_outputs attribute")
    if not isinstance(dim, int):
        raise ShapeError("Split of a symbolic axis needs explicit split sizes")
    size = -(-dim // num_outputs)
    sizes = [size] * (dim // size) + ([dim % size] if dim % size else [])
    return sizes


def _split_shape(specs, *, axis=0, num_outputs=None):
    x = specs[0]
    a = norm_axis(axis, len(x.shape))
    split = const_ints(specs[1] if len(specs) > 1 else None, "Split sizes")
    if split is None and num_outputs and isinstance(x.shape[a], DimExpr):
        # ONNX: num_outputs - 1 parts of ceil(dim / num_outputs), the rest in the last
        # (assumed non-empty; the plan checks it with real sizes)
        n, dim = int(num_outputs), x.shape[a]
        part = floordiv(add(dim, n - 1), n)
        sizes = [part] * (n - 1) + [add(dim, mul(part, -(n - 1)))]
        return [TensorSpec(x.shape[:a] + (d,) + x.shape[a + 1:], x.dtype) for d in sizes]
    sizes = _split_sizes(x.shape[a], split, num_outputs)
    if isinstance(x.shape[a], int) and sum(sizes) != x.shape[a]:
        raise ShapeError(f"split sizes {sizes} do not add up to axis {a} size {x.shape[a]}")
    return [TensorSpec(x.shape[:a] + (s,) + x.shape[a + 1 :], x.dtype) for s in sizes]


def _split_grad(ctx, *gs):
    return call("Concat", *gs, axis=ctx.attrs["axis"]), None


@onnx_adapter("Split")
def _split_forms(node: ImportNode) -> None:
    """Opset < 13 gave sizes as the ``split`` attribute; before opset 18 an even split had no
    ``num_outputs`` and took the node's output count."""
    if "split" in node.attrs:
        attribute_to_input(node, "split", 1)
    elif len(node.inputs) < 2 and "num_outputs" not in node.attrs:
        node.attrs["num_outputs"] = len(node.outputs)


@defop("Split", shape=_split_shape, grad=_split_grad, outputs=("outputs...",),
       static=("split",))
def split(input, split=None, *, axis=0, num_outputs=None):
    a = axis % input.ndim
    sizes = _split_sizes(input.shape[a], None if split is None else split.tolist(), num_outputs)
    # np.split's views (part k: from the k-th running total to the next, the last to the end),
    # sliced directly: np.split costs ~10 us a call
    lead = (slice(None),) * a
    parts, start = [], 0
    for k, size in enumerate(sizes):
        stop = start + size if k < len(sizes) - 1 else None
        parts.append(input[(*lead, slice(start, stop))])
        start += size
    return tuple(parts)


@specializer(split.kernel)
def _split_at(site: CallSite):
    """The parts' index tuples worked out once (the sizes constant, the shape planned)."""
    if len(site.shapes) > 1 and site.shapes[1] is not None and site.values[1] is None:
        return None  # sizes computed at run time
    src, generic = site.shapes[0], site.generic
    a = site.attrs.get("axis", 0) % len(src)
    split = site.values[1] if len(site.values) > 1 else None
    sizes = _split_sizes(src[a], None if split is None else split.tolist(),
                         site.attrs.get("num_outputs"))
    if sum(sizes) != src[a] or len(sizes) != len(site.out_shapes):
        return None  # the generic kernel's error names the problem
    lead = (slice(None),) * a
    index, start = [], 0
    for size in sizes:
        index.append((*lead, slice(start, start + size)))
        start += size

    def split_at(input, split=None):
        if input.shape != src:
            return generic(input, split)
        return tuple(input[i] for i in index)
    return split_at


# Slice ---------------------------------------------------------------------------------------

def _slice_index(shape, starts, ends, axes, steps):
    nd = len(shape)
    axes = list(range(len(starts))) if axes is None else [int(a) % nd for a in axes]
    steps = [1] * len(starts) if steps is None else [int(s) for s in steps]
    index = [slice(None)] * nd
    for s, e, a, st in zip(starts, ends, axes, steps):
        if st == 0:
            raise ShapeError("Slice step cannot be 0")
        dim = shape[a]
        s, e = int(s), int(e)
        if st > 0:
            s = min(max(s + dim if s < 0 else s, 0), dim)
            e = min(max(e + dim if e < 0 else e, 0), dim)
            index[a] = slice(s, e, st)
        else:
            s = min(max(s + dim if s < 0 else s, -1), dim - 1)
            e = min(max(e + dim if e < 0 else e, -1), dim - 1)
            index[a] = slice(s, None if e < 0 else e, st)
    return tuple(index)


# Exporters write "to the end" as INT64_MAX, INT32_MAX or 1e9 (and "before the start" as their
# negatives): a bound this large is clamped to the axis, as ONNX clamps any bound beyond it.
_HUGE = 10**9


def _clamped_bound(dim: Dim, b: Dim, step: int, is_end: bool) -> Dim:
    """A Slice bound on a symbolic axis, as an index in [-1, dim] (ONNX's clamping)."""
    if isinstance(b, DimExpr):
        return b
    b = int(b)
    if b >= _HUGE:
        return dim if step > 0 or is_end else add(dim, -1)
    if b <= -_HUGE:
        return 0 if step > 0 or not is_end else -1
    # a small bound is assumed to lie inside the axis, as in traced code that slices it
    return b if b >= 0 else add(dim, b)


def _symbolic_slice_len(dim: Dim, s: Dim, e: Dim, st: int) -> Dim:
    """The length of ``s:e:st`` on a symbolic axis: ceil((end - begin) / step) as a floor
    division."""
    if st == 0:
        raise ShapeError("Slice step cannot be 0")
    begin = _clamped_bound(dim, s, st, is_end=False)
    end = _clamped_bound(dim, e, st, is_end=True)
    span = add(end, mul(begin, -1)) if st > 0 else add(begin, mul(end, -1))
    return span if abs(st) == 1 else floordiv(add(span, abs(st) - 1), abs(st))


def _slice_shape(specs):
    x = specs[0]
    starts = const_ints(specs[1], "Slice starts")
    ends = const_ints(specs[2], "Slice ends")
    axes = const_ints(specs[3] if len(specs) > 3 else None, "Slice axes")
    steps = const_ints(specs[4] if len(specs) > 4 else None, "Slice steps")
    nd = len(x.shape)
    axes_n = list(range(len(starts))) if axes is None else [norm_axis(int(a), nd) for a in axes]
    out = list(x.shape)
    for i, a in enumerate(axes_n):
        dim = x.shape[a]
        st = 1 if steps is None else int(steps[i])
        s, e = starts[i], ends[i]
        if isinstance(dim, int) and not isinstance(s, DimExpr) and not isinstance(e, DimExpr):
            idx = _slice_index((dim,), [int(s)], [int(e)], [0], [st])[0]
            out[a] = len(range(*idx.indices(dim)))
        else:
            out[a] = _symbolic_slice_len(dim, s, e, st)
    return TensorSpec(tuple(out), x.dtype)


def _slice_grad(ctx, g):
    x, starts, ends, axes, steps = (list(ctx.inputs) + [None, None])[:5]
    return (call("SliceGrad", g, ints(x.shape), starts, ends, axes, steps),
            None, None, None, None)


@onnx_adapter("Slice", before=10)
def _slice_attributes(node: ImportNode) -> None:
    """Opset < 10: ``starts``, ``ends`` and ``axes`` were attributes."""
    if "starts" not in node.attrs:
        return
    node.need(1)
    if "ends" not in node.attrs:
        raise node.error("a Slice with a 'starts' attribute needs 'ends'")
    bounds = [node.const(node.attrs.pop("starts")), node.const(node.attrs.pop("ends"))]
    if "axes" in node.attrs:
        bounds.append(node.const(node.attrs.pop("axes")))
    node.inputs = [node.inputs[0], *bounds]


def _slice_value(in_specs, values, attrs):
    """A 1-D value sliced by literal bounds (``Shape(x)[1:]``)."""
    if len(in_specs[0].shape) != 1:
        return None
    data, starts, ends = list(values[0]), values[1], values[2]
    steps = values[4] if len(values) > 4 and values[4] is not None else (1,)
    if not all(isinstance(x, int) for x in (*starts, *ends, *steps)):
        return None
    return tuple(data[slice(starts[0], ends[0], steps[0])])


@defop("Slice", symbolic_value=_slice_value, shape=_slice_shape, grad=_slice_grad,
       static=("starts", "ends", "axes", "steps"))
def slice_(data, starts, ends, axes=None, steps=None):
    starts, ends = starts.tolist(), ends.tolist()
    axes = None if axes is None else axes.tolist()
    steps = None if steps is None else steps.tolist()
    if steps is None or all(st > 0 for st in steps):
        # positive steps: Python's slices clamp bounds to the axis as ONNX does
        nd = data.ndim
        index = [slice(None)] * nd
        for i, (s, e) in enumerate(zip(starts, ends)):
            index[i if axes is None else axes[i] % nd] = slice(s, e, 1 if steps is None
                                                              else steps[i])
        return data[tuple(index)]
    return data[_slice_index(data.shape, starts, ends, axes, steps)]


@specializer(slice_.kernel)
def _slice_at(site: CallSite):
    values = site.values[1:] + (None,) * (5 - len(site.values))
    if any(v is None for s, v in zip(site.shapes[1:], values) if s is not None):
        return None  # bounds computed at run time
    starts, ends, axes, steps = (None if v is None else v.tolist() for v in values)
    src, generic = site.shapes[0], site.generic
    index = _slice_index(src, starts, ends, axes, steps)

    def sliced(data, *bounds):
        if data.shape != src:
            return generic(data, *bounds)
        return data[index]
    return sliced


def _slice_grad_shape(specs):
    shape = const_ints(specs[1], "SliceGrad shape")
    return TensorSpec(tuple(shape), specs[0].dtype)


@defop("SliceGrad", traceable=False, shape=_slice_grad_shape, domain="onemodel", static=("shape",))
def slice_grad(grad, shape, starts, ends, axes=None, steps=None):
    """The gradient of Slice: ``grad`` written into zeros of the input's ``shape``."""
    out = np.zeros(tuple(shape.tolist()), grad.dtype)
    out[_slice_index(out.shape, starts.tolist(), ends.tolist(),
                     None if axes is None else axes.tolist(),
                     None if steps is None else steps.tolist())] = grad
    return out


# Gather --------------------------------------------------------------------------------------

def _gather_shape(specs, *, axis=0):
    x, idx = specs
    if idx.dtype not in (DType.I64, DType.I32):
        raise ShapeError(f"Gather indices must be I64 or I32, got {idx.dtype.name}")
    a = norm_axis(axis, len(x.shape))
    return TensorSpec(x.shape[:a] + idx.shape + x.shape[a + 1 :], x.dtype)


def _gather_grad(ctx, g):
    x, idx = ctx.inputs
    return call("GatherGrad", g, idx, ints(x.shape), axis=ctx.attrs["axis"]), None


def _gather_value(in_specs, values, attrs):
    """Elements of a 1-D value at literal indices (``Shape(x)[0]``)."""
    if len(in_specs[0].shape) != 1:
        return None
    data, idx = values
    return tuple(data[int(i) % len(data)] for i in idx if isinstance(i, int))


@defop("Gather", symbolic_value=_gather_value, shape=_gather_shape, grad=_gather_grad)
def gather(data, indices, *, axis=0):
    # np.take counts negative indices from the end, as ONNX does, and refuses out-of-range ones
    return np.take(data, indices, axis=axis % data.ndim)


@specializer(gather.kernel)
def _gather_at(site: CallSite):
    """A constant scalar index (a token position, one head) into a tensor of rank 2 or more:
    a basic-indexing view instead of np.take's copy. An index out of range, or a rank-1 input
    (basic indexing would give a numpy scalar, not a 0-d array), keeps the generic kernel."""
    idx, src, generic = site.values[1], site.shapes[0], site.generic
    if idx is None or idx.ndim != 0 or len(src) < 2:
        return None
    axis = site.attrs.get("axis", 0) % len(src)
    if not -src[axis] <= int(idx) < src[axis]:
        return None
    index = (slice(None),) * axis + (int(idx),)

    def gathered(data, indices):
        if data.shape != src:
            return generic(data, indices)
        return data[index]
    return gathered


def _gather_grad_shape(specs, *, axis=0):
    return TensorSpec(tuple(const_ints(specs[2], "GatherGrad shape")), specs[0].dtype)


@defop("GatherGrad", traceable=False, shape=_gather_grad_shape, domain="onemodel", static=("shape",))
def gather_grad(grad, indices, shape, *, axis=0):
    """The gradient of Gather: ``grad`` summed into zeros of ``shape`` at ``indices``."""
    shape = tuple(shape.tolist())
    a = axis % len(shape)
    idx = np.where(indices < 0, indices + shape[a], indices).reshape(-1)
    out = np.zeros(shape, grad.dtype)
    moved = np.moveaxis(out, a, 0)
    g = np.moveaxis(grad.reshape(shape[:a] + (idx.size,) + shape[a + 1 :]), a, 0)
    np.add.at(moved, idx, g)
    return out


# Pad -----------------------------------------------------------------------------------------

def _pad_widths(ndim, pads, axes):
    axes = list(range(ndim)) if axes is None else [int(a) % ndim for a in axes]
    n = len(axes)
    widths = [(0, 0)] * ndim
    for i, a in enumerate(axes):
        widths[a] = (int(pads[i]), int(pads[i + n]))
    return widths


def _pad_shape(specs, *, mode="constant"):
    x = specs[0]
    pads = const_ints(specs[1], "Pad pads")
    axes = const_ints(specs[3] if len(specs) > 3 else None, "Pad axes")
    widths = _pad_widths(len(x.shape), pads, axes)
    return TensorSpec(tuple(add(d, b + e) for d, (b, e) in zip(x.shape, widths)), x.dtype)


def _pad_grad(ctx, g):
    x, pads = ctx.inputs[:2]
    axes = ctx.inputs[3] if len(ctx.inputs) > 3 else None
    return (call("PadGrad", g, ints(x.shape), pads, axes, mode=ctx.attrs["mode"]),
            None, None, None)


@onnx_adapter("Pad", before=11)
def _pad_attributes(node: ImportNode) -> None:
    """Opset < 11: ``pads`` and ``value`` were attributes."""
    if "pads" not in node.attrs:
        return
    node.need(1)
    value = node.attrs.pop("value", 0.0)
    node.inputs = [node.inputs[0], node.const(node.attrs.pop("pads")),
                   node.const(value, np.float32)]


@defop("Pad", onnx_opset=lambda attrs: 19 if attrs.get("mode") == "wrap" else 18,
       shape=_pad_shape, grad=_pad_grad, static=("pads", "axes"))
def pad(data, pads, constant_value=None, axes=None, *, mode="constant"):
    widths = _pad_widths(data.ndim, pads.tolist(), None if axes is None else axes.tolist())
    if any(b < 0 or e < 0 for b, e in widths):  # negative pads crop
        crop = tuple(slice(max(-b, 0), d - max(-e, 0)) for (b, e), d in zip(widths, data.shape))
        data = data[crop]
        widths = [(max(b, 0), max(e, 0)) for b, e in widths]
    if mode == "constant":
        value = 0 if constant_value is None else constant_value.reshape(()).item()
        return np.pad(data, widths, mode="constant", constant_values=value)
    if mode in ("reflect", "edge", "wrap"):
        return np.pad(data, widths, mode=mode)
    raise ValueError(f"Pad mode must be constant, reflect, edge or wrap, got {mode!r}")


@specializer(pad.kernel)
def _pad_at(site: CallSite):
    """A Pad with constant pads, axes (and value): the output made with ``np.empty``, the input
    copied in, the border filled, every slice made once here. ``np.pad`` spends 20-25 us in
    Python on a small tensor (Swin's window padding: two Pads took 50 of its 235 us); this
    takes about 2 us. Constant mode writes each border element once with the value, cast as
    np.pad casts it. Reflect, edge and wrap copy border slabs from inside the output, axis by
    axis, each from the position np.pad's own index map gives (np.pad applied to
    ``arange``), so they are np.pad's values by construction. Negative pads (crops), more
    than 64 border slabs, a pad or value fed at run time, or shapes other than planned keep
    the generic kernel."""
    mode = site.attrs.get("mode", "constant")
    if mode not in ("constant", "reflect", "edge", "wrap") or not site.shapes[0]:
        return None  # (a 0-d input: the generic kernel's error)
    shape, dtype = site.shapes[0], site.dtypes[0]
    given = [site.values[i] if i < len(site.values) else None for i in range(4)]
    present = [i < len(site.shapes) and site.shapes[i] is not None for i in range(4)]
    if given[1] is None or any(p and v is None for p, v in zip(present[2:], given[2:])):
        return None  # a pad, value or axes known only at run time
    pads_const, value_const, axes_const = given[1], given[2], given[3]
    try:
        widths = _pad_widths(len(shape), pads_const.tolist(),
                             None if axes_const is None else axes_const.tolist())
        # the value as np.pad takes it (a numpy scalar of its own kind: 300 into int8 wraps,
        # where a Python int would raise), so the assignments below cast as np.pad's do
        value = np.asarray(0 if value_const is None else value_const.reshape(()).item()).ravel()[0]
    except (ValueError, IndexError, TypeError):
        return None  # malformed: the generic kernel says what is wrong
    if any(b < 0 or e < 0 for b, e in widths):
        return None
    oshape = tuple(d + b + e for d, (b, e) in zip(shape, widths))
    if site.out_shapes and site.out_shapes[0] != oshape:
        return None
    inner = tuple(slice(b, b + d) for d, (b, _) in zip(shape, widths))
    whole = (slice(None),) * len(shape)
    if mode == "constant":
        # disjoint slabs covering the border: along axis a, the begin and end slabs, limited
        # to the inner range on the axes before a and whole on the axes after it
        fills = []
        for a, (b, _) in enumerate(widths):
            for lo, hi in ((0, b), (b + shape[a], oshape[a])):
                if hi > lo:
                    fills.append(inner[:a] + (slice(lo, hi),) + whole[a + 1:])
        copies = []
    else:
        # axis by axis: each border position p takes the slab at np.pad's source for p, whole
        # on the axes already padded, inside on those still to pad
        fills, copies = [], []
        for a, (b, e) in enumerate(widths):
            if b + e == 0:
                continue
            try:
                source = np.pad(np.arange(shape[a]), (b, e), mode=mode)
            except ValueError:  # an empty axis to extend: the generic kernel's error
                return None
            for p in (*range(b), *range(b + shape[a], oshape[a])):
                copies.append((whole[:a] + (p,) + inner[a + 1:],
                               whole[:a] + (b + int(source[p]),) + inner[a + 1:]))
        if len(copies) > 64:
            return None  # many thin slabs: np.pad's vectorized copies win
    generic = site.generic

    def padded(data, pads, constant_value=None, axes=None):
        if data.shape != shape or data.dtype != dtype or pads is not pads_const or \
                constant_value is not value_const or axes is not axes_const:
            return generic(data, pads, constant_value, axes)
        out = np.empty(oshape, dtype)
        for border in fills:
            out[border] = value
        out[inner] = data
        for to, source in copies:
            out[to] = out[source]
        return out
    return padded


def _pad_grad_shape(specs, *, mode="constant"):
    return TensorSpec(tuple(const_ints(specs[1], "PadGrad shape")), specs[0].dtype)


@defop("PadGrad", traceable=False, shape=_pad_grad_shape, domain="onemodel", static=("shape",))
def pad_grad(grad, shape, pads, axes=None, *, mode="constant"):
    """The gradient of Pad: every output element adds into the input element it was copied from."""
    shape = tuple(shape.tolist())
    size = int(np.prod(shape))
    source = np.arange(size, dtype=np.int64).reshape(shape)
    if mode == "constant":
        src = pad.kernel(source, pads, np.asarray(-1, np.int64), axes, mode="constant")
    else:
        src = pad.kernel(source, pads, None, axes, mode=mode)
    keep = src >= 0
    flat = np.bincount(src[keep], weights=grad[keep].astype(np.float64), minlength=size)
    return flat.astype(grad.dtype).reshape(shape)


# Shape, OneHot -------------------------------------------------------------------------------

def _shape_shape(specs, *, start=0, end=None):
    x = specs[0]
    dims = x.shape[slice(start, end)]
    return TensorSpec((len(dims),), DType.I64, tuple(dims))


@defop("Shape", shape=_shape_shape)
def shape(data, *, start=0, end=None):
    return np.asarray(data.shape[slice(start, end)], dtype=np.int64)


def _one_hot_shape(specs, *, axis=-1):
    idx, depth, values = specs
    d = const_ints(depth, "OneHot depth")
    nd = len(idx.shape) + 1
    a = norm_axis(axis, nd)
    out = list(idx.shape)
    out.insert(a, int(d[0]))
    return TensorSpec(tuple(out), values.dtype)


@defop("OneHot", shape=_one_hot_shape, static=("depth",))
def one_hot(indices, depth, values, *, axis=-1):
    d = int(np.asarray(depth).reshape(-1)[0])
    idx = np.where(indices < 0, indices + d, indices).astype(np.int64)
    hot = idx[..., None] == np.arange(d)
    out = np.where(hot, values[1], values[0]).astype(values.dtype)
    nd = indices.ndim + 1
    return np.moveaxis(out, -1, axis % nd)


# Size, Tile, EyeLike, ReverseSequence --------------------------------------------------------

def _size_shape(specs):
    # the element count is known from the shape alone, symbolic or not, as Shape's value is
    return TensorSpec((), DType.I64, (numel(specs[0].shape),))


@defop("Size", shape=_size_shape)
def size(data):
    """ONNX Size: the number of elements of ``data`` as an int64 scalar."""
    return np.asarray(data.size, dtype=np.int64)


def _tile_shape(specs):
    x, reps = specs
    if reps.dtype is not DType.I64:
        raise ShapeError(f"Tile repeats must be I64, got {reps.dtype.name}")
    repeats = const_ints(reps, "Tile repeats")
    if len(repeats) != len(x.shape):
        raise ShapeError(f"Tile repeats {list(repeats)} must have one entry per axis of the "
                         f"rank-{len(x.shape)} input")
    if any(isinstance(r, int) and r < 0 for r in repeats):
        raise ShapeError(f"Tile repeats {list(repeats)} must be non-negative")
    out = tuple(mul(d, r) for d, r in zip(x.shape, repeats))
    value = None
    if x.value is not None and len(x.shape) == 1 and isinstance(repeats[0], int):
        value = tuple(x.value) * repeats[0]  # a shape tensor repeated: its value stays known
    return TensorSpec(out, x.dtype, value)


def _tile_grad(ctx, g):
    x, repeats = ctx.inputs
    reps = [int(r) for r in repeats.numpy().reshape(-1)]
    # (r0, d0, r1, d1, ...) -> sum over the repeat axes
    split = [v for r, d in zip(reps, x.shape) for v in (r, d)]
    return call("ReduceSum", g.reshape(*split), ints(list(range(0, 2 * x.ndim, 2))),
                keepdims=0), None


@defop("Tile", shape=_tile_shape, grad=_tile_grad, static=("repeats",))
def tile(input, repeats):
    """ONNX Tile: ``input`` repeated ``repeats[i]`` times along axis i."""
    reps = [int(r) for r in np.asarray(repeats).reshape(-1)]
    if len(reps) != input.ndim or any(r < 0 for r in reps):
        raise ShapeError(f"Tile repeats {reps} must be one non-negative entry per axis of the "
                         f"rank-{input.ndim} input")
    return np.tile(input, reps)


def _eye_like_shape(specs, *, dtype=None, k=0):
    x = specs[0]
    if len(x.shape) != 2:
        raise ShapeError(f"EyeLike needs a 2-D input, got rank {len(x.shape)}")
    return TensorSpec(x.shape, x.dtype if dtype is None else DType.of(dtype))


@onnx_adapter("EyeLike")
def _eye_like_dtype(node: ImportNode) -> None:
    """``dtype`` is an ONNX element-type number in a file, a DType in the op set."""
    if "dtype" in node.attrs:
        node.attrs["dtype"] = node.dtype(node.attrs["dtype"])


@defop("EyeLike", shape=_eye_like_shape)
def eye_like(input, *, dtype=None, k=0):
    """ONNX EyeLike: ones on diagonal ``k`` of a matrix shaped like ``input``, zeros elsewhere,
    of element type ``dtype`` (the input's when not given)."""
    if input.ndim != 2:
        raise ShapeError(f"EyeLike needs a 2-D input, got rank {input.ndim}")
    dt = input.dtype if dtype is None else DType.of(dtype).numpy
    return np.eye(input.shape[0], input.shape[1], k=int(k), dtype=dt)


def _reverse_sequence_shape(specs, *, batch_axis=1, time_axis=0):
    x, lens = specs
    if len(x.shape) < 2:
        raise ShapeError(f"ReverseSequence needs an input of rank >= 2, got {len(x.shape)}")
    if {batch_axis, time_axis} != {0, 1}:
        raise ShapeError(f"batch_axis and time_axis must be 0 and 1 in some order, got "
                         f"{batch_axis} and {time_axis}")
    if lens.dtype is not DType.I64 or len(lens.shape) != 1:
        raise ShapeError(f"sequence_lens must be a 1-D I64 tensor, got {lens}")
    return TensorSpec(x.shape, x.dtype)


@defop("ReverseSequence", shape=_reverse_sequence_shape)
def reverse_sequence(input, sequence_lens, *, batch_axis=1, time_axis=0):
    """ONNX ReverseSequence: along ``time_axis``, the first ``sequence_lens[b]`` elements of
    batch entry b reversed, the rest copied."""
    x = np.moveaxis(input, (batch_axis, time_axis), (0, 1))  # (batch, time, ...)
    b, t = x.shape[:2]
    lens = np.asarray(sequence_lens, np.int64).reshape(-1)
    if lens.shape != (b,) or (lens < 0).any() or (lens > t).any():
        raise ShapeError(f"sequence_lens {lens.tolist()} must hold {b} lengths in [0, {t}]")
    pos = np.arange(t)
    src = np.where(pos < lens[:, None], lens[:, None] - 1 - pos, pos)  # (batch, time)
    out = x[np.arange(b)[:, None], src]
    return np.ascontiguousarray(np.moveaxis(out, (0, 1), (batch_axis, time_axis)))
