"""Index-driven ops with ONNX semantics: GatherElements, GatherND, ScatterElements, ScatterND,
Trilu, CumSum, Range, Hardmax, TopK, DepthToSpace, SpaceToDepth, Einsum. GatherElements and TopK
have gradient rules (a ScatterElements with reduction 'add' into zeros); the others are
inference ops."""

from __future__ import annotations

import functools
import math

import numpy as np

from ..dtype import DType
from ..errors import ShapeError
from ..symbolic import DimExpr, add, floordiv, mul
from ._grad import _tensor, call
from .adapters import ImportNode, onnx_adapter
from .base import TensorSpec, const_ints, defop, norm_axis, same_dtype


def _positive(indices, size):
    return np.where(indices < 0, indices + size, indices).astype(np.int64)


def _scatter_add_into_zeros(like, indices, g, axis):
    """The gradient of picking elements of ``like`` at ``indices`` along ``axis``: ``g`` summed
    into zeros shaped like ``like`` (repeated indices add up)."""
    zeros = _tensor()._wrap(np.zeros(like.shape, g._data.dtype))
    return call("ScatterElements", zeros, indices, g, axis=axis, reduction="add")


def _gather_elements_grad(ctx, g):
    data, indices = ctx.inputs
    return _scatter_add_into_zeros(data, indices, g, ctx.attrs["axis"]), None


@defop("GatherElements", shape=lambda specs, axis=0: TensorSpec(specs[1].shape, specs[0].dtype),
       grad=_gather_elements_grad)
def gather_elements(data, indices, *, axis=0):
    a = axis % data.ndim
    return np.take_along_axis(data, _positive(indices, data.shape[a]), axis=a)


def _gather_nd_shape(specs, *, batch_dims=0):
    data, idx = specs
    last = idx.shape[-1]
    if not isinstance(last, int):
        raise ShapeError("GatherND needs a static last index axis")
    return TensorSpec(tuple(idx.shape[:-1]) + tuple(data.shape[batch_dims + last:]), data.dtype)


@defop("GatherND", shape=_gather_nd_shape)
def gather_nd(data, indices, *, batch_dims=0):
    b = batch_dims
    batch = data.shape[:b]
    flat_data = data.reshape((-1,) + data.shape[b:])
    flat_idx = indices.reshape((-1,) + indices.shape[b:])
    out = []
    for d, i in zip(flat_data, flat_idx):
        k = i.shape[-1]
        pos = _positive(i, np.asarray(d.shape[:k]))
        out.append(d[tuple(np.moveaxis(pos, -1, 0))])
    res = np.stack(out) if out else np.zeros((0,), data.dtype)
    return res.reshape(batch + indices.shape[b:-1] + data.shape[b + indices.shape[-1]:])


def _reduce_into(target, index, values, reduction):
    if reduction == "none":
        target[index] = values
    elif reduction == "add":
        np.add.at(target, index, values)
    elif reduction == "mul":
        np.multiply.at(target, index, values)
    elif reduction == "max":
        np.maximum.at(target, index, values)
    elif reduction == "min":
        np.minimum.at(target, index, values)
    else:
        raise ValueError(f"unknown reduction {reduction!r}")


@defop("ScatterElements", shape=lambda specs, **a: TensorSpec(specs[0].shape, specs[0].dtype))
def scatter_elements(data, indices, updates, *, axis=0, reduction="none"):
    a = axis % data.ndim
    out = data.copy()
    idx = list(np.indices(indices.shape, sparse=True))
    idx[a] = _positive(indices, data.shape[a])
    _reduce_into(out, tuple(idx), updates, reduction)
    return out


@defop("ScatterND", shape=lambda specs, **a: TensorSpec(specs[0].shape, specs[0].dtype))
def scatter_nd(data, indices, updates, *, reduction="none"):
    out = data.copy()
    k = indices.shape[-1]
    flat = indices.reshape(-1, k)
    ups = updates.reshape((flat.shape[0],) + data.shape[k:])
    for i, u in zip(flat, ups):
        _reduce_into(out, tuple(_positive(i, np.asarray(data.shape[:k]))), u, reduction)
    return out


@defop("Trilu", shape=lambda specs, **a: TensorSpec(specs[0].shape, specs[0].dtype))
def trilu(input, k=None, *, upper=1):
    """The upper (or lower) triangle of the last two axes, from diagonal ``k``."""
    kk = 0 if k is None else int(np.asarray(k).reshape(-1)[0])
    return np.triu(input, kk) if upper else np.tril(input, kk)


def _cum_sum_shape(specs, **_):
    from ..dtype import NUMERIC

    return TensorSpec(specs[0].shape, same_dtype(specs[:1], NUMERIC))


@defop("CumSum", shape=_cum_sum_shape)
def cum_sum(x, axis, *, exclusive=0, reverse=0):
    a = int(np.asarray(axis).reshape(-1)[0]) % x.ndim
    y = np.flip(x, a) if reverse else x
    out = np.cumsum(y, axis=a, dtype=x.dtype)
    if exclusive:
        out = np.concatenate([np.zeros_like(np.take(out, [0], axis=a)),
                              np.take(out, range(out.shape[a] - 1), axis=a)], axis=a)
    return np.flip(out, a) if reverse else out


def _range_shape(specs):
    start, limit, delta = (const_ints(s, "Range bounds") for s in specs)
    dt = same_dtype(specs)
    s, lim, d = start[0], limit[0], delta[0]
    if any(isinstance(v, DimExpr) for v in (s, lim, d)):  # a traced arange(x.shape[i])
        if isinstance(d, DimExpr) or int(d) == 0:
            raise ShapeError(f"Range over a symbolic size needs a constant non-zero step, got "
                             f"start={s}, limit={lim}, delta={d}")
        d = int(d)
        if isinstance(s, float) or isinstance(lim, float):
            raise ShapeError(f"Range over a symbolic size needs integer bounds, got start={s}, "
                             f"limit={lim}")
        # ceil((limit - start) / delta) as a floor division: (span + |delta| - 1) // |delta|;
        # the count is assumed non-negative (an empty symbolic range is checked at plan time)
        span = add(lim, mul(s, -1)) if d > 0 else add(s, mul(lim, -1))
        return TensorSpec((floordiv(add(span, abs(d) - 1), abs(d)),), dt)
    if not d:
        raise ShapeError("Range delta cannot be 0")
    n = max(int(np.ceil((lim - s) / d)), 0)
    return TensorSpec((n,), dt)


@defop("Range", shape=_range_shape, static=("start", "limit", "delta"))
def range_(start, limit, delta):
    s, l, d = (np.asarray(v).reshape(()) for v in (start, limit, delta))
    n = max(int(np.ceil((l - s) / d)), 0)
    return (s + np.arange(n) * d).astype(np.asarray(start).dtype)


def _last_axis_shape(specs, *, axis=-1):
    norm_axis(axis, len(specs[0].shape))
    return TensorSpec(specs[0].shape, specs[0].dtype)


@defop("Hardmax", shape=_last_axis_shape)
def hardmax(input, *, axis=-1):
    """1 at the first maximum along ``axis``, 0 elsewhere."""
    a = axis % input.ndim
    out = np.zeros_like(input)
    np.put_along_axis(out, np.expand_dims(np.argmax(input, axis=a), a), 1, axis=a)
    return out


def _topk_shape(specs, *, axis=-1, largest=1, sorted=1):
    x = specs[0]
    if specs[1].value is not None:
        k = const_ints(specs[1], "TopK k")[0]
    else:  # k computed at run time: the data decides the extent (planned as NonZero's is)
        from .dynamic import fresh_dim

        k = fresh_dim("topk")
    a = norm_axis(axis, len(x.shape))
    shape = tuple(k if i == a else d for i, d in enumerate(x.shape))
    return [TensorSpec(shape, x.dtype), TensorSpec(shape, DType.I64)]


def _topk_grad(ctx, g_values, g_indices):
    x = ctx.inputs[0]
    indices = ctx.outputs[1]
    return _scatter_add_into_zeros(x, indices, g_values, ctx.attrs["axis"]), None


@defop("TopK", shape=_topk_shape, outputs=("Values", "Indices"), grad=_topk_grad)
def top_k(X, K, *, axis=-1, largest=1, sorted=1):
    """The k largest (or smallest) elements along ``axis``; ties keep the lower index."""
    k = int(np.asarray(K).reshape(-1)[0])
    a = axis % X.ndim
    if not largest:
        key = X
    elif X.dtype.kind == "u":  # negation would wrap around: count down from the top instead
        key = np.iinfo(X.dtype).max - X
    else:
        key = -X
    n = X.shape[a]
    idx = _first_k_stable(key, k, a) if n >= _PARTITION_MIN and 0 < 4 * k <= n else None
    if idx is None:
        order = np.argsort(key, axis=a, kind="stable")
        idx = np.take(order, range(k), axis=a)
    return np.take_along_axis(X, idx, axis=a), idx.astype(np.int64)


# rows at least this long take the partition (below it the full sort's one call is faster:
# 2x1000, k=5, 31 us against 58 for the partition's passes)
_PARTITION_MIN = 4096


def _first_k_stable(key, k, axis):
    """The first ``k`` positions of a stable ascending argsort of ``key`` along ``axis``, in
    linear time and a sort of k: the k-th smallest key per row by partition, every key below
    it, and the equal ones with the lowest indices to make up k, then those sorted stably
    (1x100000, k=100: 9.3 -> 1.1 ms; 1x25200, k=100, YOLOv5's boxes: 1.98 -> 0.26 ms). None
    where a row's k-th key is NaN or the dtype is not ordered by ``<`` as the sort orders it
    (complex, object): the full sort decides there."""
    if key.dtype.kind not in "biuf":
        return None
    rows = np.moveaxis(key, axis, -1)
    n = rows.shape[-1]
    flat = rows.reshape(-1, n)
    kth = np.partition(flat, k - 1, axis=1)[:, k - 1:k]
    if key.dtype.kind == "f" and np.isnan(kth).any():
        return None
    less = flat < kth
    equal = flat == kth
    need = k - less.sum(axis=1, keepdims=True)
    if (equal.sum(axis=1, keepdims=True) == need).all():  # no tie past the k-th: every one
        take = less | equal
    else:  # the equal keys with the lowest indices
        take = less | (equal & (np.cumsum(equal, axis=1) <= need))
    cols = np.nonzero(take)[1].reshape(flat.shape[0], k)  # per row, in index order
    order = np.argsort(np.take_along_axis(flat, cols, axis=1), axis=1, kind="stable")
    picked = np.take_along_axis(cols, order, axis=1).reshape(rows.shape[:-1] + (k,))
    return np.moveaxis(picked, -1, axis)


def _d2s_shape(specs, *, blocksize=1, mode="DCR"):
    n, c, h, w = specs[0].shape
    b = blocksize
    return TensorSpec((n, c // (b * b) if isinstance(c, int) else c, _mul(h, b), _mul(w, b)),
                      specs[0].dtype)


def _mul(d, k):
    return d * k if isinstance(d, (int, DimExpr)) else d


@defop("DepthToSpace", shape=_d2s_shape)
def depth_to_space(input, *, blocksize=1, mode="DCR"):
    n, c, h, w = input.shape
    b = blocksize
    if mode == "DCR":
        t = input.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        t = input.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return t.reshape(n, c // (b * b), h * b, w * b)


def _s2d_shape(specs, *, blocksize=1, mode="DCR"):
    n, c, h, w = specs[0].shape
    b = blocksize
    if not isinstance(h, int) or not isinstance(w, int):
        raise ShapeError("SpaceToDepth needs static spatial sizes")
    return TensorSpec((n, _mul(c, b * b), h // b, w // b), specs[0].dtype)


@defop("SpaceToDepth", shape=_s2d_shape)
def space_to_depth(input, *, blocksize=1, mode="DCR"):
    n, c, h, w = input.shape
    b = blocksize
    t = input.reshape(n, c, h // b, b, w // b, b)
    t = t.transpose(0, 3, 5, 1, 2, 4) if mode == "DCR" else t.transpose(0, 1, 3, 5, 2, 4)
    return t.reshape(n, c * b * b, h // b, w // b)


def _einsum_shape(specs, *, equation=""):
    from ..dtype import NUMERIC

    dt = same_dtype(specs, NUMERIC | {DType.BF16, DType.BOOL})
    arrays = [np.empty(tuple(d if isinstance(d, int) else 2 for d in s.shape), np.int8)
              for s in specs]
    if any(not all(isinstance(d, int) for d in s.shape) for s in specs):
        raise ShapeError("Einsum needs static shapes")
    return TensorSpec(np.einsum(equation, *arrays).shape, dt)


@functools.lru_cache(maxsize=512)
def _einsum_as_matmul(equation: str, a_shape: tuple, b_shape: tuple):
    """How a two-operand einsum with a contraction runs as one batched matrix product, as
    PyTorch runs it: (A's summed-only axes, A's permutation to (batch, left, contracted), its 3-D
    shape, the same three for B to (batch, contracted, right), the product's shape by letter,
    the permutation to the output's letters); None for what ``np.einsum`` keeps (an ellipsis, a
    letter repeated in one operand, sizes that differ or broadcast, no contracted letter, an
    implicit output). numpy's einsum runs such a contraction as C loops without BLAS: batched
    8x32x32 products took 76 us against onnxruntime's 16."""
    eq = equation.replace(" ", "")
    if "->" not in eq or "." in eq:
        return None
    lhs, out = eq.split("->")
    operands = lhs.split(",")
    if len(operands) != 2:
        return None
    a, b = operands
    if len(a) != len(a_shape) or len(b) != len(b_shape) or 0 in a_shape or 0 in b_shape or \
            any(len(set(t)) != len(t) for t in (a, b, out)):
        return None  # (an empty operand: np.einsum, which sums no terms to 0 even beside inf)
    size: dict[str, int] = {}
    for letters, shape in ((a, a_shape), (b, b_shape)):
        for ch, d in zip(letters, shape):
            if size.setdefault(ch, d) != d:
                return None
    if any(ch not in size for ch in out):
        return None
    batch = [c for c in out if c in a and c in b]
    left = [c for c in out if c in a and c not in b]
    right = [c for c in out if c in b and c not in a]
    contracted = [c for c in a if c in b and c not in out]
    if not contracted:
        return None
    a_sum = tuple(i for i, c in enumerate(a) if c not in b and c not in out)
    b_sum = tuple(i for i, c in enumerate(b) if c not in a and c not in out)
    a_kept = [c for c in a if c in b or c in out]
    b_kept = [c for c in b if c in a or c in out]
    a_perm = tuple(a_kept.index(c) for c in batch + left + contracted)
    b_perm = tuple(b_kept.index(c) for c in batch + contracted + right)

    def prod(letters):
        return math.prod(size[c] for c in letters)

    a_3d = (prod(batch), prod(left), prod(contracted))
    b_3d = (prod(batch), prod(contracted), prod(right))
    by_letter = batch + left + right
    return (a_sum, a_perm, a_3d, b_sum, b_perm, b_3d, tuple(size[c] for c in by_letter),
            tuple(by_letter.index(c) for c in out))


def _matmul_einsum(plan, A, B):
    a_sum, a_perm, a_3d, b_sum, b_perm, b_3d, shape, out_perm = plan
    if a_sum:
        A = A.sum(axis=a_sum)
    if b_sum:
        B = B.sum(axis=b_sum)
    y = np.matmul(A.transpose(a_perm).reshape(a_3d), B.transpose(b_perm).reshape(b_3d))
    y = y.reshape(shape).transpose(out_perm)
    return y if y.flags.c_contiguous else y.copy()  # (ascontiguousarray makes 0-d 1-d)


@defop("Einsum", shape=_einsum_shape)
def einsum(*Inputs, equation=""):
    """BF16 operands are summed in float32 and the result rounded once (as PyTorch and the
    ONNX reference do). A float32/float64 contraction of two operands runs as one batched
    matrix product (:func:`_einsum_as_matmul`); the rest as ``np.einsum``."""
    dt = Inputs[0].dtype
    if dt == DType.BF16.numpy:
        Inputs = tuple(x.astype(np.float32) for x in Inputs)
    if len(Inputs) == 2 and Inputs[0].dtype in _MATMUL_FLOATS and \
            Inputs[1].dtype == Inputs[0].dtype:
        plan = _einsum_as_matmul(equation, Inputs[0].shape, Inputs[1].shape)
        if plan is not None:
            return _matmul_einsum(plan, *Inputs).astype(dt, copy=False)
    return np.asarray(np.einsum(equation, *Inputs)).astype(dt, copy=False)


_MATMUL_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


# Scatter (deprecated) ------------------------------------------------------------------------

@onnx_adapter("Scatter")
def _scatter_is_scatter_elements(node: ImportNode) -> None:
    """ONNX Scatter (opsets 9-10, deprecated since 11) is ScatterElements without a reduction:
    it imports as that op (which is also what an export writes)."""
    node.op = "ScatterElements"
