"""FusedElementwise: on the GPU, one generated ``cupy.ElementwiseKernel`` per (program, dtype),
cached, so a chain of bias, activation, residual add and clip costs one pass over memory; on the
host (the CPU tests), the steps one by one with this plugin's own kernels (the reference kernel of
an op this plugin has none for).

The program's grammar is the op's (``onemodel.tensors.ops.fused.parse_program``): each step's
literals (an op's constant inputs past its chain operands, then its numeric attributes) are read
the generic way, by the op's definition. Inside the kernel every step computes in ``float``
(``double`` for float64 inputs) and the result is rounded once to the output dtype; the reference
rounds float16 after every step, so float16 results may differ from it by an ulp per step.

Every op that may join a chain (``OpDef.chain_operands``) has a C expression in :data:`_EXPR`
(a test checks it against the op definitions); :func:`supports` refuses a program naming an op
without one, so such a node runs on the reference kernel instead of failing here.
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections.abc import Callable

import numpy as np

from onemodel.tensors.ops import OPS
from onemodel.tensors.ops.fused import parse_program
from onemodel.tensors.registry import resolve

from ._xp import is_device_array, namespace, scalar

_kernels: dict[tuple, object] = {}
_lock = threading.Lock()


def _literal(v: float) -> str:
    if math.isnan(v):
        return "(C)(0.0/0.0)"
    if math.isinf(v):
        return "(C)(1.0/0.0)" if v > 0 else "(C)(-1.0/0.0)"
    return f"(C){v!r}"


def _clamp01(v: str) -> str:
    """``v`` clamped to [0, 1] as np.clip does it (NaN stays NaN: comparisons with it are false)."""
    return f"({v} < (C)0 ? (C)0 : ({v} > (C)1 ? (C)1 : {v}))"


def _clip(a: list[str], lits: list[float], dt: np.dtype) -> str:
    expr = a[0]
    lo, hi = lits  # an omitted bound is nan
    if not math.isnan(lo):
        expr = f"({expr} < {_literal(lo)} ? {_literal(lo)} : {expr})"
    if not math.isnan(hi):
        expr = f"({expr} > {_literal(hi)} ? {_literal(hi)} : {expr})"
    return expr


def _pow(a: list[str], lits: list[float], dt: np.dtype) -> str:
    """numpy's power with a scalar exponent takes these exponents' short ways, whose special
    values differ from pow()'s (sqrt(-inf) is nan, pow(-inf, 0.5) inf): the same here. Its
    float16 loop takes no square root."""
    p = lits[0]
    short = {0.0: "(C)1", 1.0: a[0], 2.0: f"({a[0]} * {a[0]})", -1.0: f"((C)1 / {a[0]})"}
    if dt != np.float16:
        short[0.5] = f"sqrt({a[0]})"
    return short.get(p, f"pow({a[0]}, {_literal(p)})")


# op -> the C expression of one step over the compute type C, from the operands' names ``a``, the
# literals ``lits`` (floats, as ``chain_literals`` lists them) and the inputs' dtype ``dt``. NaN
# propagates as numpy's maximum/minimum/where/clip propagate it (a comparison with NaN is false).
_EXPR: dict[str, Callable[[list[str], list[float], np.dtype], str]] = {
    "Add": lambda a, lits, dt: f"({a[0]} + {a[1]})",
    "Sub": lambda a, lits, dt: f"({a[0]} - {a[1]})",
    "Mul": lambda a, lits, dt: f"({a[0]} * {a[1]})",
    "Div": lambda a, lits, dt: f"({a[0]} / {a[1]})",
    "Neg": lambda a, lits, dt: f"(-{a[0]})",
    "Abs": lambda a, lits, dt: f"fabs({a[0]})",
    "Exp": lambda a, lits, dt: f"exp({a[0]})",
    "Sqrt": lambda a, lits, dt: f"sqrt({a[0]})",
    "Tanh": lambda a, lits, dt: f"tanh({a[0]})",
    "Erf": lambda a, lits, dt: f"erf({a[0]})",
    "Sigmoid": lambda a, lits, dt: (f"({a[0]} >= (C)0 ? (C)1 / ((C)1 + exp(-{a[0]})) "
                                    f": exp({a[0]}) / ((C)1 + exp({a[0]})))"),
    "Relu": lambda a, lits, dt: f"({a[0]} < (C)0 ? (C)0 : {a[0]})",
    "LeakyRelu": lambda a, lits, dt: f"({a[0]} >= (C)0 ? {a[0]} : {a[0]} * {_literal(lits[0])})",
    "HardSigmoid": lambda a, lits, dt: _clamp01(
        f"({a[0]} * {_literal(lits[0])} + {_literal(lits[1])})"),
    "HardSwish": lambda a, lits, dt: f"({a[0]} * {_clamp01(f'({a[0]} / (C)6 + (C)0.5)')})",
    "Clip": _clip,
    "Pow": _pow,
}


def source(steps, n_inputs: int, dtype=np.float64) -> str:
    """The C body of the kernel for parsed ``steps`` (inputs ``x0..`` of ``dtype``, output
    ``y``)."""
    dtype = np.dtype(dtype)
    lines = [f"C a{j} = (C)x{j};" for j in range(n_inputs)]
    for k, (op, refs, lits) in enumerate(steps):
        args = [f"a{r[1:]}" if r[0] == "x" else f"t{r[1:]}" for r in refs]
        lines.append(f"C t{k} = {_EXPR[op](args, lits, dtype)};")
    lines.append(f"y = (T)t{len(steps) - 1};")
    return "\n".join(lines)


def supports(*inputs, program=()) -> bool:
    """True when every step's op has a C expression here (the generated kernel can run it)."""
    return all(str(p).split(None, 1)[0] in _EXPR for p in program if str(p).strip())


def _kernel(program: tuple, n_inputs: int, dtype: np.dtype):
    key = (program, n_inputs, dtype.str)
    kern = _kernels.get(key)
    if kern is None:
        import cupy

        body = source(parse_program(program, n_inputs), n_inputs, dtype)
        compute = "double" if dtype == np.float64 else "float"
        params = ", ".join(f"T x{j}" for j in range(n_inputs))
        name = "onemodel_fused_" + hashlib.sha1("|".join(program).encode()).hexdigest()[:12]
        kern = cupy.ElementwiseKernel(params, "T y", body, name,
                                      preamble=f"typedef {compute} C;")
        with _lock:
            _kernels[key] = kern
    return kern


_host_kernels: dict[str, object] = {}


def _host_kernel(op: str):
    """This plugin's xp-generic kernel of ``op``, or the reference kernel where it has none."""
    fn = _host_kernels.get(op)
    if fn is None:
        from .plugin import KERNELS

        fn = resolve(KERNELS[op][0]) if op in KERNELS else OPS[op].kernel
        _host_kernels[op] = fn
    return fn


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
        opdef = OPS[op]
        consts = opdef.inputs[opdef.chain_operands:]
        dt = args[0].dtype
        args += [None if name in opdef.optional and np.isnan(v) else scalar(v, dt)
                 for name, v in zip(consts, lits)]
        attrs = dict(zip(opdef.attrs, lits[len(consts):]))
        values.append(_host_kernel(op)(*args, **attrs))
    return values[-1]
