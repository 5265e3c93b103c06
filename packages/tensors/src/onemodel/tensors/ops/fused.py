"""Fused ops (domain ``onemodel``) that the runtime's fusion pass produces: a Conv or Gemm with
its following activation applied in place, saving one pass over the output. Inference only."""

from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from .base import defop
from .linalg import _gemm_shape, gemm
from .nn import _conv_shape, conv

ACTIVATIONS = ("Relu", "Sigmoid", "Tanh")


def _activate(y: np.ndarray, activation: str) -> np.ndarray:
    if activation == "Relu":
        return np.maximum(y, 0, out=y)
    if activation == "Tanh":
        return np.tanh(y, out=y)
    if activation == "Sigmoid":
        # 1 / (1 + exp(-y)) without overflow warnings: exp of -|y| only
        e = np.exp(-np.abs(y))
        pos = y >= 0
        np.divide(1, 1 + e, out=y, where=pos)
        np.divide(e, 1 + e, out=y, where=~pos)
        return y
    raise ShapeError(f"unknown fused activation {activation!r}; expected one of {ACTIVATIONS}")


def _fused_conv_shape(specs, *, activation="Relu", **attrs):
    return _conv_shape(specs, **attrs)


@defop("FusedConv", shape=_fused_conv_shape, domain="onemodel")
def fused_conv(X, W, B=None, *, activation="Relu", auto_pad="NOTSET", dilations=None, group=1,
               kernel_shape=None, pads=None, strides=None):
    """Conv followed by ``activation`` (Relu, Sigmoid or Tanh)."""
    y = conv.kernel(X, W, B, auto_pad=auto_pad, dilations=dilations, group=group,
                    kernel_shape=kernel_shape, pads=pads, strides=strides)
    return _activate(y, activation)


def _fused_gemm_shape(specs, *, activation="Relu", **attrs):
    return _gemm_shape(specs, **attrs)


@defop("FusedGemm", shape=_fused_gemm_shape, domain="onemodel")
def fused_gemm(A, B, C=None, *, activation="Relu", alpha=1.0, beta=1.0, transA=0, transB=0):
    """Gemm followed by ``activation`` (Relu, Sigmoid or Tanh)."""
    y = gemm.kernel(A, B, C, alpha=alpha, beta=beta, transA=transA, transB=transB)
    return _activate(y, activation)
