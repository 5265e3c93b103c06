"""The op set: each op defined once, grouped by family. ``OPS`` maps a name to its definition."""

from . import (  # noqa: F401 - defines the ops
    attention,
    controlflow,
    dynamic,
    elementwise,
    fused,
    gather,
    linalg,
    loss,
    math,
    nn,
    quantize,
    recurrent,
    reduction,
    resample,
    sequence,
    shape,
    signal,
)
from .base import OPS, OpDef, TensorSpec, defop, get_op

__all__ = ["OPS", "OpDef", "TensorSpec", "defop", "get_op"]
