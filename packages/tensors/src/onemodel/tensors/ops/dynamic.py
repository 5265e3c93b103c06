"""Ops whose output sizes depend on the *values* of their inputs: NonZero, Unique, Compress,
NonMaxSuppression.

Their shape rules cannot give those sizes: they give a fresh anonymous symbol (``fresh_dim``)
for each extent the data decides. A planner that meets such a symbol it cannot bind runs the
node's kernel and plans what follows from the sizes it produced (see the runtime's planner).
When every input is a plan-time constant the planner evaluates the node instead, and the
symbol never reaches a plan.
"""

from __future__ import annotations

import itertools

import numpy as np

from ..dtype import DType
from ..errors import ShapeError
from ..symbolic import DimExpr
from .base import TensorSpec, defop, norm_axis

_COUNTER = itertools.count()
DYNAMIC_PREFIX = "dyn__"


def fresh_dim(what: str) -> DimExpr:
    """A new symbol for an extent only the data decides (``dyn__nonzero_3``): no two calls give
    the same symbol, so no rule may assume two such extents are equal."""
    return DimExpr.symbol(f"{DYNAMIC_PREFIX}{what}_{next(_COUNTER)}")


def is_dynamic_dim(d) -> bool:
    """Whether ``d`` involves a symbol made by :func:`fresh_dim`."""
    return isinstance(d, DimExpr) and any(s.startswith(DYNAMIC_PREFIX) for s in d.symbols())


# NonZero -------------------------------------------------------------------------------------

def _nonzero_shape(specs):
    x = specs[0]
    return TensorSpec((len(x.shape), fresh_dim("nonzero")), DType.I64)


@defop("NonZero", shape=_nonzero_shape)
def nonzero(X):
    """Indices of the non-zero elements, one row per axis (row-major order), as ONNX gives."""
    if X.ndim == 0:  # numpy refuses 0-d: a 0-d tensor has no index rows
        return np.zeros((0, int(bool(X))), np.int64)
    return np.array(np.nonzero(X), dtype=np.int64).reshape(X.ndim, -1)


# Unique --------------------------------------------------------------------------------------

def _unique_shape(specs, *, axis=None, sorted=1):
    x = specs[0]
    n = fresh_dim("unique")
    if axis is None:
        total = 1
        for d in x.shape:
            total = total * d
        y = (n,)
        inverse = (total,)
    else:
        a = norm_axis(axis, len(x.shape))
        y = tuple(n if i == a else d for i, d in enumerate(x.shape))
        inverse = (x.shape[a],)
    return [TensorSpec(y, x.dtype), TensorSpec((n,), DType.I64),
            TensorSpec(inverse, DType.I64), TensorSpec((n,), DType.I64)]


@defop("Unique", shape=_unique_shape, outputs=("Y", "indices", "inverse_indices", "counts"))
def unique(X, *, axis=None, sorted=1):
    """The unique elements (or slices along ``axis``), sorted or in order of first occurrence,
    with the index of each one's first occurrence, the inverse map, and the counts."""
    if axis is None:
        flat = X.reshape(-1)
        y, first, inverse, counts = np.unique(flat, return_index=True, return_inverse=True,
                                              return_counts=True)
    else:
        a = axis % X.ndim
        y, first, inverse, counts = np.unique(X, return_index=True, return_inverse=True,
                                              return_counts=True, axis=a)
    inverse = inverse.reshape(-1)
    if not sorted:  # order of first occurrence: renumber the sorted uniques
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        y = y[order] if axis is None else np.take(y, order, axis=axis % X.ndim)
        first, counts, inverse = first[order], counts[order], rank[inverse]
    return (y, first.astype(np.int64), inverse.astype(np.int64), counts.astype(np.int64))


# Compress ------------------------------------------------------------------------------------

def _compress_shape(specs, *, axis=None):
    x, cond = specs
    if len(cond.shape) != 1:
        raise ShapeError(f"the condition must be 1-D, got rank {len(cond.shape)}")
    n = fresh_dim("compress")
    if axis is None:
        return TensorSpec((n,), x.dtype)
    a = norm_axis(axis, len(x.shape))
    return TensorSpec(tuple(n if i == a else d for i, d in enumerate(x.shape)), x.dtype)


@defop("Compress", shape=_compress_shape)
def compress(input, condition, *, axis=None):
    """The slices along ``axis`` (elements of the flattened input without one) whose condition
    is true; a condition shorter than the axis selects among the first slices only."""
    cond = np.asarray(condition).astype(bool).reshape(-1)
    limit = input.size if axis is None else input.shape[axis % input.ndim]
    if cond.size > limit:
        raise ShapeError(f"Compress: the condition has {cond.size} entries, the axis only "
                         f"{limit}")
    return np.compress(cond, input, axis=axis)


# NonMaxSuppression ---------------------------------------------------------------------------

def _nms_shape(specs, *, center_point_box=0):
    boxes, scores = specs[0], specs[1]
    if len(boxes.shape) != 3 or len(scores.shape) != 3:
        raise ShapeError("boxes must be [batch, boxes, 4] and scores [batch, classes, boxes]")
    return TensorSpec((fresh_dim("nms"), 3), DType.I64)


def _corners(b: np.ndarray, center_point_box: int) -> np.ndarray:
    """[n, 4] boxes as (y_min, x_min, y_max, x_max) in float64."""
    b = b.astype(np.float64)
    if center_point_box:
        x, y, w, h = b[:, 0], b[:, 1], b[:, 2] / 2, b[:, 3] / 2
        return np.stack([y - h, x - w, y + h, x + w], axis=1)
    return np.stack([np.minimum(b[:, 0], b[:, 2]), np.minimum(b[:, 1], b[:, 3]),
                     np.maximum(b[:, 0], b[:, 2]), np.maximum(b[:, 1], b[:, 3])], axis=1)


@defop("NonMaxSuppression", shape=_nms_shape)
def non_max_suppression(boxes, scores, max_output_boxes_per_class=None, iou_threshold=None,
                        score_threshold=None, *, center_point_box=0):
    """Greedy per-class selection of the highest-scoring boxes, dropping each box whose
    intersection over union with a selected one exceeds ``iou_threshold``; rows are
    ``[batch, class, box]``. ``max_output_boxes_per_class`` defaults to 0 (select none)."""
    limit = 0 if max_output_boxes_per_class is None or np.size(max_output_boxes_per_class) == 0 \
        else max(int(np.asarray(max_output_boxes_per_class).reshape(-1)[0]), 0)
    iou_t = 0.0 if iou_threshold is None or np.size(iou_threshold) == 0 \
        else float(np.asarray(iou_threshold).reshape(-1)[0])
    score_t = None if score_threshold is None or np.size(score_threshold) == 0 \
        else float(np.asarray(score_threshold).reshape(-1)[0])
    rows = []
    for b in range(boxes.shape[0]):
        c = _corners(boxes[b], center_point_box)
        area = (c[:, 2] - c[:, 0]) * (c[:, 3] - c[:, 1])
        for k in range(scores.shape[1]):
            s = scores[b, k]
            cand = np.arange(s.shape[0]) if score_t is None else np.nonzero(s > score_t)[0]
            # highest score first, the lower index first among equal scores
            cand = cand[np.lexsort((cand, -s[cand].astype(np.float64)))]
            chosen: list[int] = []
            for i in cand:
                if len(chosen) >= limit:
                    break
                if chosen and _suppressed(c, area, int(i), chosen, iou_t):
                    continue
                chosen.append(int(i))
            rows.extend((b, k, i) for i in chosen)
    return np.array(rows, dtype=np.int64).reshape(-1, 3)


def _suppressed(c, area, i: int, chosen: list[int], iou_t: float) -> bool:
    sel = c[chosen]
    ih = np.minimum(c[i, 2], sel[:, 2]) - np.maximum(c[i, 0], sel[:, 0])
    iw = np.minimum(c[i, 3], sel[:, 3]) - np.maximum(c[i, 1], sel[:, 1])
    inter = np.where((ih > 0) & (iw > 0), ih * iw, 0.0)
    union = area[i] + area[chosen] - inter
    valid = (inter > 0) & (area[i] > 0) & (area[chosen] > 0) & (union > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        iou = np.where(valid, inter / np.where(union > 0, union, 1), 0.0)
    return bool(np.any(valid & (iou > iou_t)))
