"""FusedElementwise: on the GPU, one generated ``cupy.ElementwiseKernel`` per (program, dtype),
cached, so a chain of bias, activation, residual add and clip costs one pass over memory; on the
host (the CPU tests), the steps one by one with this plugin's own kernels.

The program's grammar is the op's (``onemodel.tensors.ops.fused.parse_program``). Inside the
kernel every step computes in ``float`` (``double`` for float64 inputs) and the result is
rounded once to the output dtype; the reference rounds float16 after every step, so float16
results may differ from it by an ulp per step.
"""

from __future__ import annotations

import hashlib
import math
import threading

import numpy as np

from onemodel.tensors.ops.fused import parse_program

from . import kernels
from ._xp import is_device_array, namespace, scalar

# op -> the host kernel of one step (the xp-generic kernels of this plugin)
_STEPS = {
    "Add": kernels.add, "Sub": kernels.sub, "Mul": kernels.mul, "Div": kernels.div,
    "Neg": kernels.neg, "Abs": kernels.abs_, "Exp": kernels.exp, "Sqrt": kernels.sqrt,
    "Tanh": kernels.tanh, "Erf": kernels.erf, "Sigmoid": kernels.sigmoid, "Relu": kernels.relu,
}

# op -> C expression of one step over the compute type C ({0}, {1}: operands). NaN propagates
# as numpy's maximum/minimum propagate it (a comparison with NaN is false).
_EXPR = {
    "Add": "({0} + {1})", "Sub": "({0} - {1})", "Mul": "({0} * {1})", "Div": "({0} / {1})",
    "Neg": "(-{0})", "Abs": "fabs({0})", "Exp": "exp({0})", "Sqrt": "sqrt({0})",
    "Tanh": "tanh({0})", "Erf": "erf({0})",
    "Sigmoid": "({0} >= (C)0 ? (C)1 / ((C)1 + exp(-{0})) : exp({0}) / ((C)1 + exp({0})))",
    "Relu": "({0} < (C)0 ? (C)0 : {0})",
}

_kernels: dict[tuple, object] = {}
_lock = threading.Lock()


def _literal(v: float) -> str:
    if math.isinf(v):
        return "(C)(1.0/0.0)" if v > 0 else "(C)(-1.0/0.0)"
    return f"(C){v!r}"


def source(steps, n_inputs: int) -> str:
    """The C body of the kernel for parsed ``steps`` (inputs ``x0..``, output ``y``)."""
    lines = [f"C a{j} = (C)x{j};" for j in range(n_inputs)]
    for k, (op, refs, lits) in enumerate(steps):
        args = [f"a{r[1:]}" if r[0] == "x" else f"t{r[1:]}" for r in refs]
        if op == "Clip":
            expr = args[0]
            lo, hi = lits
            if not math.isnan(lo):
                expr = f"({expr} < {_literal(lo)} ? {_literal(lo)} : {expr})"
            if not math.isnan(hi):
                expr = f"({expr} > {_literal(hi)} ? {_literal(hi)} : {expr})"
        else:
            expr = _EXPR[op].format(*args)
        lines.append(f"C t{k} = {expr};")
    lines.append(f"y = (T)t{len(steps) - 1};")
    return "\n".join(lines)


def _kernel(program: tuple, n_inputs: int, dtype: np.dtype):
    key = (program, n_inputs, dtype.str)
    kern = _kernels.get(key)
    if kern is None:
        import cupy

        body = source(parse_program(program, n_inputs), n_inputs)
        compute = "double" if dtype == np.float64 else "float"
        params = ", ".join(f"T x{j}" for j in range(n_inputs))
        name = "onemodel_fused_" + hashlib.sha1("|".join(program).encode()).hexdigest()[:12]
        kern = cupy.ElementwiseKernel(params, "T y", body, name,
                                      preamble=f"typedef {compute} C;")
        with _lock:
            _kernels[key] = kern
    return kern


def fused_elementwise(*inputs, program=()):
    """A chain of elementwise ops as one node (see the module docstring)."""
    program = tuple(str(p) for p in program)
    if any(is_device_array(x) for x in inputs):
        xp = namespace(*inputs)
        shape = np.broadcast_shapes(*(x.shape for x in inputs))
        out = xp.empty(shape, inputs[0].dtype)
        if out.size:
            _kernel(program, len(inputs), np.dtype(inputs[0].dtype))(*inputs, out)
        return out
    values: list = []
    for op, refs, lits in parse_program(program, len(inputs)):
        args = [inputs[int(r[1:])] if r[0] == "x" else values[int(r[1:])] for r in refs]
        if op == "Clip":
            dt = args[0].dtype
            values.append(kernels.clip(args[0], *(None if np.isnan(v) else scalar(v, dt)
                                                  for v in lits)))
        else:
            values.append(_STEPS[op](*args))
    return values[-1]
