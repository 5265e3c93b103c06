"""onemodel.tensors: tensors, the op set, autograd and the plugin registry."""

from . import functional, registry, trace_state
from .autograd import enable_grad, is_grad_enabled, no_grad
from .dtype import DType
from .errors import (
    AutogradError,
    DTypeError,
    OneModelError,
    PluginError,
    ReleasedTensorError,
    ShapeError,
)
from .generator import Generator
from .ops import OPS, OpDef, TensorSpec
from .symbolic import DimExpr
from .tensor import (
    Tensor,
    cat,
    concat,
    ones_like,
    split,
    stack,
    tensor,
    where,
    zeros_like,
)

from_dlpack = Tensor.from_dlpack  # torch.from_dlpack / np.from_dlpack's counterpart

__version__ = "0.1.0"

__all__ = [
    "OPS",
    "AutogradError",
    "DType",
    "DTypeError",
    "DimExpr",
    "Generator",
    "OneModelError",
    "OpDef",
    "PluginError",
    "ReleasedTensorError",
    "ShapeError",
    "Tensor",
    "TensorSpec",
    "cat",
    "concat",
    "enable_grad",
    "from_dlpack",
    "functional",
    "is_grad_enabled",
    "no_grad",
    "ones_like",
    "registry",
    "split",
    "stack",
    "tensor",
    "trace_state",
    "where",
    "zeros_like",
]
