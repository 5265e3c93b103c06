"""Loss ops with no ONNX form: CTCLoss (domain ``onemodel``). They cannot be traced; losses
belong to training, not to an inference graph."""

from __future__ import annotations

import numpy as np

from ..errors import OneModelError, ShapeError
from ..symbolic import format_shape
from ._grad import call, ints
from .base import TensorSpec, defop


def _ctc_shape(specs, *, blank=0, zero_infinity=0):
    lp = specs[0]
    if len(lp.shape) != 3:
        raise ShapeError("CTCLoss log_probs must be (T, N, C)")
    return TensorSpec((lp.shape[1],), lp.dtype)


def _check_ctc(log_probs, targets, input_lengths, target_lengths, blank):
    """Refuse lengths and labels out of range: they would index past the data or, for a target
    length beyond the padded targets, silently cut the target short."""
    steps, n, c = log_probs.shape
    il = np.asarray(input_lengths).reshape(-1)
    tl = np.asarray(target_lengths).reshape(-1)
    if il.size != n or tl.size != n:
        raise OneModelError(f"input_lengths and target_lengths need one entry per sample ({n}); "
                            f"got {il.size} and {tl.size}")
    bad = (il < 1) | (il > steps)
    if bad.any():
        raise OneModelError(f"input_lengths must be in [1, {steps}] (the time steps of log_probs);"
                            f" got {int(il[bad][0])}")
    room = targets.shape[1] if targets.ndim == 2 else targets.shape[0]
    bad = (tl < 0) | (tl > room)
    if bad.any():
        raise OneModelError(f"target_lengths must be in [0, {room}] (the width of targets); got "
                            f"{int(tl[bad][0])}")
    if targets.ndim == 1 and int(tl.sum()) > room:
        raise OneModelError(f"target_lengths add up to {int(tl.sum())}, but the concatenated "
                            f"targets hold {room}")
    used = np.concatenate([t for t in _targets(targets, tl, n)] or [np.zeros(0, np.int64)])
    bad = (used < 0) | (used >= c) | (used == blank)
    if bad.any():
        raise OneModelError(f"target labels must be in [0, {c}) and not the blank {blank}; got "
                            f"{int(used[bad][0])}")


def _targets(targets, target_lengths, n):
    """Per-sample target sequences from a padded (N, S) or concatenated 1-D tensor."""
    lengths = [int(v) for v in target_lengths]
    if targets.ndim == 2:
        return [targets[i, : lengths[i]].astype(np.int64) for i in range(n)]
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    return [targets[offsets[i] : offsets[i + 1]].astype(np.int64) for i in range(n)]


def _extended(target, blank):
    ext = np.full(2 * len(target) + 1, blank, np.int64)
    ext[1::2] = target
    # a label may be reached from two steps back unless it is blank or repeats that label
    skip = np.zeros(len(ext), bool)
    skip[2:] = (ext[2:] != blank) & (ext[2:] != ext[:-2])
    return ext, skip


def _alpha(lp, ext, skip, length):
    a = np.full((length, len(ext)), -np.inf)
    a[0, 0] = lp[0, ext[0]]
    if len(ext) > 1:
        a[0, 1] = lp[0, ext[1]]
    for t in range(1, length):
        prev = a[t - 1]
        one = np.concatenate([[-np.inf], prev[:-1]])
        two = np.where(skip, np.concatenate([[-np.inf, -np.inf], prev[:-2]]), -np.inf)
        a[t] = np.logaddexp(np.logaddexp(prev, one), two) + lp[t, ext]
    return a


def _beta(lp, ext, skip, length):
    b = np.full((length, len(ext)), -np.inf)
    b[length - 1, -1] = lp[length - 1, ext[-1]]
    if len(ext) > 1:
        b[length - 1, -2] = lp[length - 1, ext[-2]]
    skip_next = np.concatenate([skip[2:], [False, False]])  # may s+2 be reached from s
    for t in range(length - 2, -1, -1):
        nxt = b[t + 1]
        one = np.concatenate([nxt[1:], [-np.inf]])
        two = np.where(skip_next, np.concatenate([nxt[2:], [-np.inf, -np.inf]]), -np.inf)
        b[t] = np.logaddexp(np.logaddexp(nxt, one), two) + lp[t, ext]
    return b


def _nll(a, ext):
    end = a[-1, -1]
    return -(np.logaddexp(end, a[-1, -2]) if len(ext) > 1 else end)


def _ctc_grad(ctx, g):
    lp, targets, in_len, tgt_len = ctx.inputs
    grad = call("CTCLossGrad", lp, targets, in_len, tgt_len, ctx.outputs[0], g, **ctx.attrs)
    return grad, None, None, None


@defop("CTCLoss", traceable=False, shape=_ctc_shape, grad=_ctc_grad, domain="onemodel")
def ctc_loss(log_probs, targets, input_lengths, target_lengths, *, blank=0, zero_infinity=0):
    """Per-sample negative log likelihood of ``targets`` under CTC (PyTorch's ctc_loss with
    reduction='none'); ``log_probs`` is (T, N, C)."""
    _check_ctc(log_probs, targets, input_lengths, target_lengths, blank)
    n = log_probs.shape[1]
    lp64 = log_probs.astype(np.float64)
    out = np.empty(n)
    for i, target in enumerate(_targets(targets, target_lengths, n)):
        ext, skip = _extended(target, blank)
        length = int(input_lengths[i])
        out[i] = _nll(_alpha(lp64[:length, i], ext, skip, length), ext)
    if zero_infinity:
        out[np.isinf(out)] = 0
    return out.astype(log_probs.dtype)


@defop("CTCLossGrad", traceable=False, shape=lambda specs, **a: TensorSpec(specs[0].shape, specs[0].dtype),
       domain="onemodel")
def ctc_loss_grad(log_probs, targets, input_lengths, target_lengths, nll, grad, *, blank=0,
                  zero_infinity=0):
    """PyTorch's gradient of CTCLoss with respect to log_probs: ``exp(lp) - posterior``.

    It equals the true gradient once composed with log_softmax, which is how CTC is used."""
    _check_ctc(log_probs, targets, input_lengths, target_lengths, blank)
    _steps, n, _ = log_probs.shape
    lp64 = log_probs.astype(np.float64)
    out = np.zeros(log_probs.shape, np.float64)
    for i, target in enumerate(_targets(targets, target_lengths, n)):
        length = int(input_lengths[i])
        loss = float(nll[i])
        if np.isinf(loss):  # impossible alignment: no gradient (zero_infinity or not)
            continue
        ext, skip = _extended(target, blank)
        lp = lp64[:length, i]
        ab = _alpha(lp, ext, skip, length) + _beta(lp, ext, skip, length)
        post = np.full(lp.shape, -np.inf)
        for s, c in enumerate(ext):
            post[:, c] = np.logaddexp(post[:, c], ab[:, s])
        out[:length, i] = (np.exp(lp) - np.exp(post + loss - lp)) * float(grad[i])
    return out.astype(log_probs.dtype)




def _nll_shape(specs, *, ignore_index=None, reduction="mean"):
    x, target = specs[0], specs[1]
    weight = specs[2] if len(specs) > 2 else None
    if len(x.shape) < 2:
        raise ShapeError(f"input must be (N, C, ...), got rank {len(x.shape)}")
    want = (x.shape[0], *x.shape[2:])
    if len(target.shape) != len(want) or any(
            isinstance(a, int) and isinstance(b, int) and a != b
            for a, b in zip(target.shape, want)):
        raise ShapeError(f"target has shape {format_shape(target.shape)}; for input "
                         f"{format_shape(x.shape)} it must be {format_shape(want)}")
    if weight is not None and (len(weight.shape) != 1 or (
            isinstance(weight.shape[0], int) and isinstance(x.shape[1], int)
            and weight.shape[0] != x.shape[1])):
        raise ShapeError(f"weight has shape {format_shape(weight.shape)}; it must be "
                         f"[{x.shape[1]}], one weight per class")
    if reduction == "none":
        return TensorSpec(tuple(target.shape), x.dtype)
    return TensorSpec((), x.dtype)


def _weighted_nll(log_prob, target, weight, ignore_index, reduction):
    c = log_prob.shape[1]
    t = target.astype(np.int64)
    valid = np.ones(t.shape, bool) if ignore_index is None else t != ignore_index
    bad = valid & ((t < 0) | (t >= c))  # a negative index would silently wrap around
    if bad.any():
        also = "" if ignore_index is None else f" or ignore_index {ignore_index}"
        raise OneModelError(f"target values must be class indices in [0, {c}){also}; got "
                            f"{int(t[bad][0])}")
    safe = np.where(valid, t, 0)
    picked = np.take_along_axis(log_prob, np.expand_dims(safe, 1), axis=1).squeeze(1)
    w = np.ones(c, log_prob.dtype) if weight is None else weight
    sample_w = np.where(valid, w[safe], 0).astype(log_prob.dtype)
    loss = np.where(valid, -picked * sample_w, 0)  # an ignored sample's is 0, whatever its scores
    if reduction == "none":
        return loss.astype(log_prob.dtype)
    if reduction == "sum":
        return np.asarray(loss.sum(), log_prob.dtype)
    return np.asarray(loss.sum() / sample_w.sum(), log_prob.dtype)


@defop("NegativeLogLikelihoodLoss", shape=_nll_shape)
def negative_log_likelihood_loss(input, target, weight=None, *, ignore_index=None,
                                 reduction="mean"):
    """ONNX NLL: classes on axis 1, ``weight`` per class, ``ignore_index`` skipped."""
    return _weighted_nll(input, target, weight, ignore_index, reduction)


def _sce_shape(specs, *, ignore_index=None, reduction="mean"):
    scores = specs[0]
    return [_nll_shape(specs, reduction=reduction), TensorSpec(scores.shape, scores.dtype)]


def _sample_weights(labels: np.ndarray, weights, ignore_index, reduction: str, classes: int):
    """(labels as int64 with ignored samples at class 0, each sample's weight: its class's,
    zero where ignored, divided by the kept weights' sum for a ``mean``) in float64. With
    nothing kept the weights stay zero: the gradient of that NaN mean is 0, as PyTorch's. A
    kept label outside the classes is refused, as the loss refuses it (a -1 would pick the
    last class)."""
    t = labels.astype(np.int64, copy=False)
    valid = np.ones(t.shape, bool) if ignore_index is None else t != ignore_index
    bad = valid & ((t < 0) | (t >= classes))
    if bad.any():
        also = "" if ignore_index is None else f" or ignore_index {ignore_index}"
        raise OneModelError(f"target values must be class indices in [0, {classes}){also}; "
                            f"got {int(t[bad][0])}")
    safe = t if valid.all() else np.where(valid, t, 0)
    w = np.ones(classes, np.float64) if weights is None else weights.astype(np.float64)
    sample_w = np.where(valid, w[safe], 0.0)
    total = sample_w.sum()
    if reduction == "mean" and total != 0:
        sample_w = sample_w / total
    return safe, sample_w


def _sce_grad(ctx, g, g_log_prob):
    """The scores' gradient (:func:`softmax_cross_entropy_loss_grad`), plus, where
    ``log_prob`` was used on, its own gradient through log-softmax. Under ``create_graph`` the
    same from differentiable ops on log-probabilities computed again from the scores (the
    node's own output is a constant once nothing refers to it), so a second derivative goes
    through it. Labels and class weights get none."""
    from ..autograd import grad_mode

    labels = ctx.inputs[1]
    weights = ctx.inputs[2] if len(ctx.inputs) > 2 else None
    attrs = ctx.attrs
    if not grad_mode.enabled:
        log_prob = ctx.outputs[1]
        grad = call("SoftmaxCrossEntropyLossGrad", log_prob, labels, g, weights, **attrs)
    else:
        log_prob = call("LogSoftmax", ctx.inputs[0], axis=1)
        safe, sample_w = _sample_weights(
            labels._host(), None if weights is None else weights._host(),
            attrs["ignore_index"], attrs["reduction"], log_prob.shape[1])
        dtype = log_prob.dtype.numpy
        picks = np.zeros(tuple(log_prob.shape), dtype)
        np.put_along_axis(picks, np.expand_dims(safe, 1),
                          np.expand_dims(sample_w, 1).astype(dtype), axis=1)
        tensor = _tensor_like(log_prob)
        if attrs["reduction"] == "none":  # a gradient per sample: over its classes
            g = g.reshape(g.shape[0], 1, *g.shape[1:])
        kept = tensor(np.expand_dims(sample_w, 1).astype(dtype))
        grad = call("Mul", call("Sub", call("Mul", call("Exp", log_prob), kept), tensor(picks)),
                    g)
    if np.any(g_log_prob._host()):  # (zeros where log_prob went unused)
        spread = call("ReduceSum", g_log_prob, ints([1]), keepdims=1)
        grad = call("Add", grad, call("Sub", g_log_prob,
                                      call("Mul", call("Exp", log_prob), spread)))
    return grad, None, None


def _tensor_like(like):
    """A host array to a Tensor on ``like``'s device."""
    from ..devices import to_device
    from ..tensor import Tensor

    return lambda a: Tensor._wrap(a if like.device == "cpu" else to_device(a, like.device),
                                  like.device)


@defop("SoftmaxCrossEntropyLossGrad", traceable=False, domain="onemodel",
       shape=lambda specs, **a: TensorSpec(specs[0].shape, specs[0].dtype))
def softmax_cross_entropy_loss_grad(log_prob, labels, grad, weights=None, *, ignore_index=None,
                                    reduction="mean"):
    """The gradient of :func:`softmax_cross_entropy_loss`'s loss by its scores, from the
    ``log_prob`` it returned and the loss's gradient ``grad`` (a scalar, or one per sample for
    ``reduction="none"``): ``softmax * c - (c at each sample's label)``, ``c`` the sample's
    weight (:func:`_sample_weights`) times its ``grad``."""
    safe, sample_w = _sample_weights(labels, weights, ignore_index, reduction, log_prob.shape[1])
    coef = np.expand_dims(sample_w * grad.astype(np.float64), 1)  # (N, 1, d...)
    out = np.exp(log_prob.astype(np.float64)) * coef
    picked = np.take_along_axis(out, np.expand_dims(safe, 1), axis=1) - coef
    np.put_along_axis(out, np.expand_dims(safe, 1), picked, axis=1)
    return out.astype(log_prob.dtype)


@defop("SoftmaxCrossEntropyLoss", shape=_sce_shape, grad=_sce_grad,
       outputs=("output", "log_prob"))
def softmax_cross_entropy_loss(scores, labels, weights=None, *, ignore_index=None,
                               reduction="mean"):
    """ONNX SoftmaxCrossEntropyLoss: log-softmax over axis 1, then NLL; also returns it."""
    x = scores.astype(np.float64)
    shifted = x - x.max(axis=1, keepdims=True)
    log_prob = (shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))).astype(scores.dtype)
    with np.errstate(invalid="ignore", divide="ignore"):  # a mean over no kept sample: NaN
        return _weighted_nll(log_prob, labels, weights, ignore_index, reduction), log_prob
