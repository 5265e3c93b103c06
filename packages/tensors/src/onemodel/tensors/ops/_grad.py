"""Helpers that gradient rules share: gradient rules run eagerly, on concrete shapes."""

from __future__ import annotations

import numpy as np


def call(op: str, *inputs, **attrs):
    from ..dispatch import dispatch

    return dispatch(op, inputs, attrs)


def ints(values):
    from ..tensor import Tensor

    return Tensor._wrap(np.asarray(values, dtype=np.int64))


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
