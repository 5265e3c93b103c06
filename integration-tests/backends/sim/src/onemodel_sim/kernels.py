"""The sim device's kernels: the reference kernels run on the arrays inside ``SimArray``.

``calls`` counts which kernel ran, so tests see the registry's choice (a fast kernel with a
higher priority and a ``supports`` check, the generic one otherwise).
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from onemodel.tensors.ops import OPS

from .arrays import SimArray

calls: Counter = Counter()

# ops the sim device computes itself; every other op falls back to the CPU
OPS_ON_DEVICE = ("Add", "Sub", "Mul", "Div", "Neg", "Relu", "Sigmoid", "Tanh", "Exp", "Log",
                 "Sqrt", "Pow", "MatMul", "Gemm", "Transpose", "Reshape", "ReduceSum",
                 "ReduceMean", "Where", "Greater", "Cast", "Identity", "Expand")


def _device_args(arrays):
    """Data inputs must be sim arrays; inputs read as sizes arrive as host arrays."""
    out = []
    for a in arrays:
        if a is None or isinstance(a, SimArray):
            out.append(None if a is None else a._a)
        elif isinstance(a, np.ndarray):
            out.append(a)  # a static input (axes, shape): host memory by contract
        else:
            raise TypeError(f"sim kernel got {type(a).__name__}, not a SimArray")
    return out


def _result(out):
    if isinstance(out, (tuple, list)):
        return tuple(SimArray(np.asarray(o)) for o in out)
    return SimArray(np.asarray(out))


def generic(op: str):
    kernel = OPS[op].kernel

    def run(*arrays, **attrs):
        calls[op] += 1
        return _result(kernel(*_device_args(arrays), **attrs))

    run.__name__ = f"sim_{op.lower()}"
    return run


def __getattr__(name: str):
    """``onemodel_sim.kernels:Add`` and friends, made on first use."""
    if name in OPS_ON_DEVICE:
        fn = generic(name)
        globals()[name] = fn
        return fn
    raise AttributeError(name)


def relu_fast(x, **_):
    """A second Relu, preferred (higher priority) for F32 only: the priority test's subject."""
    calls["Relu:fast"] += 1
    return SimArray(np.maximum(x._a, np.float32(0)))


def relu_fast_supports(x, **_) -> bool:
    return x.dtype == np.float32


def abs_f32(x, **_):
    """Abs for F32 only: its ``supports`` check refuses other dtypes, which then run on the
    CPU (the device has no other Abs kernel)."""
    calls["Abs:f32"] += 1
    return SimArray(np.abs(x._a))


def abs_f32_supports(x, **_) -> bool:
    return x.dtype == np.float32
