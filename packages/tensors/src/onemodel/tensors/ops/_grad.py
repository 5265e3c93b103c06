"""Helpers that gradient rules share: gradient rules run eagerly, on concrete shapes."""

from __future__ import annotations

import numpy as np


def call(op: str, *inputs, **attrs):
    return _dispatch()(op, inputs, attrs)


def ints(values):
    return _tensor()._wrap(np.asarray(values, dtype=np.int64))


# dispatch and Tensor import this package: bind them on first use, once
_bound: dict = {}


def _dispatch():
    fn = _bound.get("dispatch")
    if fn is None:
        from ..dispatch import dispatch as fn

        _bound["dispatch"] = fn
    return fn


def _tensor():
    cls = _bound.get("Tensor")
    if cls is None:
        from ..tensor import Tensor as cls

        _bound["Tensor"] = cls
    return cls


def unbroadcast(g, shape):
    """Sum ``g`` down to ``shape``: the gradient of broadcasting an input of that shape."""
    shape = tuple(shape)
    if tuple(g.shape) == shape:
        return g
    lead = g.ndim - len(shape)
    axes = list(range(lead)) + [
        lead + i for i, d in enumerate(shape) if d == 1 and g.shape[lead + i] != 1
    ]
    if axes:
        g = call("ReduceSum", g, ints(axes), keepdims=1)
    return g.reshape(*shape) if tuple(g.shape) != shape else g
