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
