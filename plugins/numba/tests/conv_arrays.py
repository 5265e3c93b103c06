"""Random convolution operands the convolution tests share (imported as a plain module)."""

from __future__ import annotations

import numpy as np


def conv_arrays(xs, ws, dtype, seed=0):
    """X (scaled by 2), W and a bias of W's output channels, drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(xs) * 2).astype(dtype)
    w = rng.standard_normal(ws).astype(dtype)
    b = rng.standard_normal(ws[0]).astype(dtype)
    return x, w, b


def file_constant(a: np.ndarray) -> np.ndarray:
    """``a`` as a file's constant: a read-only view of immutable bytes (what plans lay out
    once)."""
    return np.frombuffer(a.tobytes(), a.dtype).reshape(a.shape)


def fused_site(x, w, b, attrs, act):
    """(kernel, call site, inputs) of a Conv (``act`` empty) or FusedConv whose weights and
    bias (when given) are the site's constants, for ``specialize``."""
    from functools import partial

    from onemodel.numba import conv
    from onemodel.tensors.ops.specialize import CallSite

    kernel = conv.fused_conv if act else conv.conv
    attrs = {**attrs, **({"activation": act} if act else {})}
    generic = partial(kernel, **attrs)
    inputs = (x, w) if b is None else (x, w, b)
    want = generic(*inputs)
    site = CallSite(tuple(a.shape for a in inputs), tuple(a.dtype for a in inputs),
                    (None, w, *(() if b is None else (b,))), attrs, (want.shape,), generic)
    return kernel, site, inputs


def assert_call_agrees(call, inputs, want, tol, scale, label=""):
    """A planned call's result, returned and written into an ``out=`` (which it must return),
    within ``tol * scale`` of ``want``, with its shape and dtype."""
    got = call(*inputs)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert float(np.abs(got - want).max()) <= tol * scale, label
    out = np.full(want.shape, np.nan, want.dtype)
    assert call(*inputs, out=out) is out
    assert float(np.abs(out - want).max()) <= tol * scale, label
