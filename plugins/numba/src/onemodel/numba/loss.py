"""SoftmaxCrossEntropyLoss and its gradient (SoftmaxCrossEntropyLossGrad) over (N, C) scores:
one pass a row (its maximum, the sum of its exps, its log-probabilities, the one its label
picks), where the reference makes a dozen numpy calls. Why: a training step's loss on 64 x 10
logits took 77 us of numpy forward and back, PyTorch's 42 (docs/benchmarks.md, "Twenty-eighth
round"). The log-probabilities and gradients in float64, rounded once, as the reference's (the
loss's sum too, where the reference sums float32 terms: a few ulp apart); other ranks, and a
label outside the classes (whose error the reference words), go to the reference kernels."""

from __future__ import annotations

import math

import numpy as np

from onemodel.tensors.ops import OPS

from ._jit import jit

_NO_WEIGHTS = np.ones(0, np.float64)


@jit()
def _weights(labels, weights, has_weights, ignore_index, has_ignore, c, sample_w):
    """sample_w[i] = the weight of row i's class (1 without ``weights``), 0 where its label is
    ``ignore_index``; returns (their sum, the first row whose kept label is outside [0, c),
    or -1)."""
    total = 0.0
    for i in range(labels.shape[0]):
        t = labels[i]
        if has_ignore and t == ignore_index:
            sample_w[i] = 0.0
            continue
        if t < 0 or t >= c:
            return total, i
        w = weights[t] if has_weights else 1.0
        sample_w[i] = w
        total += w
    return total, -1


@jit()
def _loss_rows(x, labels, weights, has_weights, ignore_index, has_ignore, log_prob, losses):
    """log_prob = log_softmax(x) by rows; losses[i] = -log_prob[i, label] times the row's
    weight (0 where ignored). Returns (the weighted losses' sum, the weights' sum, the first
    bad row or -1)."""
    n, c = x.shape
    sample_w = np.empty(n, np.float64)
    total_w, bad = _weights(labels, weights, has_weights, ignore_index, has_ignore, c, sample_w)
    if bad >= 0:
        return 0.0, 0.0, bad
    total = 0.0
    for i in range(n):
        m = -np.inf
        for j in range(c):  # NaN wins, as in numpy's max
            v = np.float64(x[i, j])
            if v > m or v != v:
                m = v
        s = 0.0
        for j in range(c):
            s += math.exp(np.float64(x[i, j]) - m)
        lse = math.log(s)
        for j in range(c):
            log_prob[i, j] = (np.float64(x[i, j]) - m) - lse
        loss = 0.0  # an ignored row's, whatever its scores
        if not (has_ignore and labels[i] == ignore_index):
            loss = -np.float64(log_prob[i, labels[i]]) * sample_w[i]
        losses[i] = loss
        total += loss
    return total, total_w, -1


@jit()
def _grad_rows(log_prob, labels, g, per_sample, weights, has_weights, ignore_index, has_ignore,
               mean, out):
    """out = d loss / d scores: ``softmax * c - (c at the label)``, ``c`` the row's weight (over
    the weights' sum for a ``mean``) times its gradient (``g[i]`` with ``per_sample``, else
    ``g[0]``). Returns the first bad row or -1."""
    n, c = log_prob.shape
    sample_w = np.empty(n, np.float64)
    total_w, bad = _weights(labels, weights, has_weights, ignore_index, has_ignore, c, sample_w)
    if bad >= 0:
        return bad
    # nothing kept: every weight is 0, and so is the NaN mean's gradient, as PyTorch's
    scale = 1.0 / total_w if mean and total_w != 0.0 else 1.0
    for i in range(n):
        coef = sample_w[i] * scale * np.float64(g[i] if per_sample else g[0])
        t = -1 if has_ignore and labels[i] == ignore_index else labels[i]
        for j in range(c):
            v = math.exp(np.float64(log_prob[i, j])) * coef
            if j == t:  # in float64, rounded once: a confident row's p - 1 is tiny
                v -= coef
            out[i, j] = v
    return -1


def _plain(scores, labels, weights) -> bool:
    """(N, C) float scores, (N,) integer labels, class weights of C or none."""
    return scores.ndim == 2 and scores.dtype in (np.float32, np.float64) and \
        labels.ndim == 1 and labels.shape[0] == scores.shape[0] and labels.dtype.kind == "i" \
        and (weights is None or (weights.ndim == 1 and weights.shape[0] == scores.shape[1]))


def softmax_cross_entropy_loss(scores, labels, weights=None, *, ignore_index=None,
                               reduction="mean"):
    """ONNX SoftmaxCrossEntropyLoss (loss, log_prob) over (N, C) scores; other calls, and a
    label outside the classes, go to the reference kernel."""
    reference = OPS["SoftmaxCrossEntropyLoss"].kernel
    if not _plain(scores, labels, weights) or reduction not in ("mean", "sum", "none"):
        return reference(scores, labels, weights, ignore_index=ignore_index, reduction=reduction)
    log_prob = np.empty(scores.shape, scores.dtype)
    losses = np.empty(scores.shape[0], np.float64)
    w = _NO_WEIGHTS if weights is None else weights.astype(np.float64)
    total, total_w, bad = _loss_rows(scores, labels, w, weights is not None,
                                     0 if ignore_index is None else int(ignore_index),
                                     ignore_index is not None, log_prob, losses)
    if bad >= 0:
        return reference(scores, labels, weights, ignore_index=ignore_index, reduction=reduction)
    if reduction == "none":
        return losses.astype(scores.dtype), log_prob
    if reduction == "mean":
        with np.errstate(invalid="ignore", divide="ignore"):  # no kept row: NaN
            total = np.float64(total) / np.float64(total_w)
    return np.asarray(total, scores.dtype), log_prob


def softmax_cross_entropy_loss_grad(log_prob, labels, grad, weights=None, *, ignore_index=None,
                                    reduction="mean"):
    """SoftmaxCrossEntropyLossGrad over (N, C) log-probabilities; other calls go to the
    reference kernel."""
    reference = OPS["SoftmaxCrossEntropyLossGrad"].kernel
    per_sample = reduction == "none"
    if not _plain(log_prob, labels, weights) or reduction not in ("mean", "sum", "none") or \
            grad.shape != ((labels.shape[0],) if per_sample else ()):
        return reference(log_prob, labels, grad, weights, ignore_index=ignore_index,
                         reduction=reduction)
    out = np.empty(log_prob.shape, log_prob.dtype)
    w = _NO_WEIGHTS if weights is None else weights.astype(np.float64)
    bad = _grad_rows(log_prob, labels, grad.reshape(-1), per_sample, w, weights is not None,
                     0 if ignore_index is None else int(ignore_index), ignore_index is not None,
                     reduction == "mean", out)
    if bad >= 0:
        return reference(log_prob, labels, grad, weights, ignore_index=ignore_index,
                         reduction=reduction)
    return out
