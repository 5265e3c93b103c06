"""What an op is: one definition holding its signature, shape rule, reference kernel and gradient.

An op's *inputs* are the positional parameters of its reference kernel (a parameter defaulting to
``None`` is an optional input, ``*inputs`` is variadic) and its *attributes* are the keyword-only
parameters with their defaults. So the kernel's signature is the op's signature: one place per op.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..dtype import DType
from ..errors import DTypeError, OneModelError, ShapeError
from ..symbolic import Dim, broadcast_dim, format_shape


@dataclass(frozen=True)
class TensorSpec:
    """What a shape rule knows of a value: its shape (ints or symbols), its dtype and, for small
    constant integer tensors such as a Reshape target, its value (ints or symbolic dims)."""

    shape: tuple[Dim, ...]
    dtype: DType
    value: tuple | None = field(default=None, compare=False)

    def __str__(self) -> str:
        return f"{self.dtype.name}{format_shape(self.shape)}"


@dataclass(eq=False)
class OpDef:
    """One op of the op set."""

    name: str
    kernel: Callable
    shape_rule: Callable[..., Any]
    grad: Callable | None
    inputs: tuple[str, ...]
    optional: frozenset[str]
    variadic: bool
    attrs: dict[str, Any]
    outputs: tuple[str, ...]
    domain: str = ""
    doc: str = ""
    # inputs whose *values* the shape rule reads (a Reshape target): a graph must know them
    # before it can plan, as constants or as inputs the session treats as part of the signature
    static_inputs: frozenset[str] = frozenset()
    # what else is specific to this op, read by the tracer, the passes and the exporters
    traceable: bool = True  # False: a training-only op (a gradient kernel); no inference graph
    foldable: bool = True  # False: never constant-folded (random, or much more data out than in)
    chain_operands: int | None = None  # tensor operands, when it may join a FusedElementwise
    # the value of its small integer output from its inputs' symbolic values (``TensorSpec.value``
    # holding DimExprs), so a Reshape target computed from Shape(x) stays known: see symbolic_value
    symbolic_value: Callable | None = None
    onnx_opset: int | Callable[[dict], int] = 0  # the lowest ONNX opset that has this form
    # the reference kernel also takes keyword ``out=``: a planned output buffer it fills
    # completely and returns (the ``writes_out`` of the onemodel_register_kernels hookspec)
    writes_out: bool = False
    # every kernel of it returns arrays of its own, never a view of an input: the planner keeps
    # its outputs out of its inputs' buffer groups (a step copies an output that is a view)
    new_outputs: bool = False

    def export_opset(self, attrs: dict) -> int:
        """The lowest ONNX opset that can hold this node (its form may depend on attributes)."""
        return self.onnx_opset(attrs) if callable(self.onnx_opset) else self.onnx_opset

    def full_attrs(self, attrs: dict[str, Any] | None) -> dict[str, Any]:
        if not attrs:
            return dict(self.attrs)
        unknown = set(attrs) - set(self.attrs)
        if unknown:
            raise OneModelError(
                f"{self.name} has no attribute {', '.join(sorted(unknown))}; "
                f"its attributes are {', '.join(self.attrs) or 'none'}"
            )
        return {**self.attrs, **attrs}

    def infer(self, specs: Sequence[TensorSpec | None], attrs: dict[str, Any] | None = None):
        """Output specs of this op for these input specs (``None`` for an omitted optional input).

        Errors name the op, the input shapes and dtypes."""
        full = self.full_attrs(attrs)
        try:
            out = self.shape_rule(list(specs), **full)
        except (ShapeError, DTypeError) as exc:
            raise type(exc)(f"{self.name}: {exc} (inputs: {_describe(specs)})") from None
        except (ValueError, TypeError, IndexError, ArithmeticError) as exc:
            raise ShapeError(f"{self.name}: {exc} (inputs: {_describe(specs)})") from None
        return out if isinstance(out, list) else [out]

    @property
    def differentiable(self) -> bool:
        return self.grad is not None


def _describe(specs) -> str:
    return ", ".join("None" if s is None else str(s) for s in specs)


OPS: dict[str, OpDef] = {}


def defop(name: str, *, shape: Callable, grad: Callable | None = None, outputs=("Y",),
          domain: str = "", static: tuple[str, ...] = (), traceable: bool = True,
          foldable: bool = True, chain_operands: int | None = None,
          symbolic_value: Callable | None = None,
          onnx_opset: int | Callable[[dict], int] = 0, writes_out: bool = False,
          new_outputs: bool = False):
    """Define op ``name`` with ``shape`` (shape-and-dtype rule) and ``grad`` (gradient rule)
    around its reference numpy kernel; the other keywords are the ``OpDef`` fields of the same
    names. With ``writes_out`` the kernel's keyword-only ``out=None`` is the planned output
    buffer, not an attribute."""

    def wrap(kernel: Callable) -> OpDef:
        if name in OPS:
            raise OneModelError(f"op {name!r} is defined twice")
        sig = inspect.signature(kernel)
        params = dict(sig.parameters)
        if writes_out:
            out = params.pop("out", None)
            if out is None or out.kind is not out.KEYWORD_ONLY or out.default is not None:
                raise OneModelError(f"op {name!r}: writes_out needs a keyword-only out=None")
            if len(outputs) != 1 or outputs[0].endswith("..."):
                raise OneModelError(f"op {name!r}: writes_out is for single-output ops")
        inputs, optional, attrs, variadic = [], set(), {}, False
        for p in params.values():
            if p.kind is p.VAR_POSITIONAL:
                variadic = True
                inputs.append(p.name)
            elif p.kind is p.KEYWORD_ONLY:
                attrs[p.name] = p.default
            else:
                inputs.append(p.name)
                if p.default is None:
                    optional.add(p.name)
        unknown = set(static) - set(inputs)
        if unknown:
            raise OneModelError(f"op {name!r}: static inputs {sorted(unknown)} are not inputs")
        op = OpDef(name, kernel, shape, grad, tuple(inputs), frozenset(optional), variadic, attrs,
                   tuple(outputs), domain, inspect.getdoc(kernel) or "", frozenset(static),
                   traceable, foldable, chain_operands, symbolic_value, onnx_opset,
                   writes_out, new_outputs)
        OPS[name] = op
        return op

    return wrap


def get_op(name: str) -> OpDef:
    try:
        return OPS[name]
    except KeyError:
        raise OneModelError(f"unknown op {name!r}; the op set has {len(OPS)} ops") from None


def first_value(in_specs, values, attrs):
    """``symbolic_value`` of ops that pass their first input's value through unchanged
    (Identity, Cast, and the reshapes of a 1-D value)."""
    return values[0]


# shape-rule helpers -----------------------------------------------------------------------------

def broadcast_shapes(*shapes: Sequence[Dim]) -> tuple[Dim, ...]:
    """numpy/ONNX multidirectional broadcasting on symbolic dims.

    Sizes that only real sizes can reconcile (two different symbols, a symbol and a constant)
    broadcast as ``symbolic.broadcast_dim`` says; a plan runs this again on the real sizes, so a
    mismatch is refused there, naming the node."""
    ndim = max(len(s) for s in shapes)
    out: list[Dim] = []
    for i in range(ndim):
        dim: Dim = 1
        for s in shapes:
            j = i - (ndim - len(s))
            if j < 0:
                continue
            try:
                dim = broadcast_dim(dim, s[j])
            except ShapeError:
                raise ShapeError(
                    "shapes " + " and ".join(format_shape(s) for s in shapes)
                    + " cannot be broadcast together"
                ) from None
        out.append(dim)
    return tuple(out)


def same_dtype(specs: Sequence[TensorSpec | None], allowed=None) -> DType:
    present = [s for s in specs if s is not None]
    dt = present[0].dtype
    for s in present[1:]:
        if s.dtype is not dt:
            raise DTypeError(
                "inputs must share one dtype, got "
                + ", ".join(s.dtype.name for s in present)
                + "; cast one of them first"
            )
    if allowed is not None and dt not in allowed:
        raise DTypeError(
            f"dtype {dt.name} is not supported; use one of {', '.join(d.name for d in allowed)}"
        )
    return dt


def norm_axis(axis: int, ndim: int) -> int:
    if not -ndim <= axis < max(ndim, 1):
        raise ShapeError(f"axis {axis} is out of range for rank {ndim}")
    return axis % ndim if ndim else 0


class UnknownValueError(ShapeError):
    """A shape rule needs the value of an input that is not known yet (a graph input)."""


def const_ints(spec: TensorSpec | None, what: str) -> tuple | None:
    """The value of a small integer input that shape inference needs (None when omitted)."""
    if spec is None:
        return None
    if spec.value is None:
        raise UnknownValueError(f"{what} must be known when the graph is planned (a constant)")
    return tuple(spec.value)
