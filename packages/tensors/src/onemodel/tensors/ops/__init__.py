"""The op set: each op defined once, grouped by family. ``OPS`` maps a name to its definition."""

from . import elementwise, fused, gather, linalg, loss, math, nn, reduction, shape  # noqa: F401 - defines the ops
from .base import OPS, OpDef, TensorSpec, defop, get_op

__all__ = ["OPS", "OpDef", "TensorSpec", "defop", "get_op"]
