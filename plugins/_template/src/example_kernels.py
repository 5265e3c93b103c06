"""An example OneModel kernel plugin: one module, one entry point.

It registers a Relu kernel for F32 and F64 arrays that computes in place into a fresh output with
one numpy call. Its priority (10) beats the reference kernels (0), so the registry picks it for
those dtypes; for any other dtype, or when ``supports`` refuses a call, the reference kernel
runs instead.
"""

from __future__ import annotations

import numpy as np

from onemodel.tensors.registry import hookimpl

__version__ = "0.1.0"


def relu(x: np.ndarray) -> np.ndarray:
    """ONNX Relu: max(x, 0) elementwise; NaN stays NaN as in the reference kernel."""
    out = np.empty_like(x)
    np.maximum(x, x.dtype.type(0), out=out)
    return out


def relu_supports(x: np.ndarray) -> bool:
    """Take only arrays that have data (zero-size ones go to the reference kernel)."""
    return x.size > 0


@hookimpl
def onemodel_register_kernels(register) -> None:
    # "module:attr" names: nothing is imported until Relu first runs on F32 or F64
    register("Relu", "example_kernels:relu", dtypes=["F32", "F64"], priority=10,
             supports="example_kernels:relu_supports")
