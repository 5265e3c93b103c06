"""Symbolic dimensions: shape rules accept them so one graph serves every size of a named axis.

A dim is an ``int`` or a :class:`DimExpr`: a named symbol, or ``+``, ``*``, floor division and
``%`` of dims. Expressions fold constants and have a canonical text, so two equal expressions
compare equal.

While a trace runs, ``tensor.shape`` holds :class:`SymInt` for symbolic axes. A comparison of one
made in user code gives a :class:`SymBool`; when Python asks for its truth (``if``, ``while``,
``and``), the tracer decides whether the outcome becomes a guard on the graph or an error, so a
decision on a size is never frozen silently.
"""

from __future__ import annotations

import numbers
import operator
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Union

from . import trace_state
from .errors import ShapeError

Dim = Union[int, "DimExpr"]
Shape = tuple[Dim, ...]


class DimExpr:
    """An immutable symbolic dimension expression."""

    __slots__ = ("args", "kind", "text")

    def __init__(self, kind: str, args: tuple):
        self.kind = kind  # "sym", "+", "*", "//", "%", "broadcast"
        self.args = args
        if kind == "sym":
            self.text = args[0]
        elif kind == "broadcast":
            self.text = "broadcast(" + ", ".join(sorted(_text(a) for a in args)) + ")"
        elif kind in ("//", "%"):
            self.text = f"({_text(args[0])} {kind} {_text(args[1])})"
        else:
            self.text = "(" + f" {kind} ".join(sorted(_text(a) for a in args)) + ")"

    @staticmethod
    def symbol(name: str) -> DimExpr:
        if not name or not isinstance(name, str):
            raise ShapeError(f"a symbolic dimension needs a non-empty name, got {name!r}")
        return DimExpr("sym", (name,))

    # arithmetic -------------------------------------------------------------------------------
    def __add__(self, other: Dim) -> Dim:
        return add(self, other)

    __radd__ = __add__

    def __mul__(self, other: Dim) -> Dim:
        return mul(self, other)

    __rmul__ = __mul__

    def __floordiv__(self, other: Dim) -> Dim:
        return floordiv(self, other)

    def __rfloordiv__(self, other: Dim) -> Dim:
        return floordiv(other, self)

    def __mod__(self, other: Dim) -> Dim:
        return mod(self, other)

    def __rmod__(self, other: Dim) -> Dim:
        return mod(other, self)

    def __sub__(self, other: Dim) -> Dim:
        return add(self, mul(other, -1))

    def __rsub__(self, other: Dim) -> Dim:
        return add(other, mul(self, -1))

    # identity ---------------------------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        return isinstance(other, DimExpr) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)

    def __str__(self) -> str:
        t = self.text
        return t[1:-1] if t.startswith("(") and t.endswith(")") else t

    def __repr__(self) -> str:
        return f"DimExpr({str(self)!r})"

    def symbols(self) -> set[str]:
        if self.kind == "sym":
            return {self.args[0]}
        out: set[str] = set()
        for a in self.args:
            if isinstance(a, DimExpr):
                out |= a.symbols()
        return out

    def evaluate(self, bindings: Mapping[str, int]) -> int:
        """The integer value once every symbol is bound."""
        if self.kind == "sym":
            try:
                return int(bindings[self.args[0]])
            except KeyError:
                raise ShapeError(f"symbol {self.args[0]!r} is not bound") from None
        vals = [evaluate(a, bindings) for a in self.args]
        if self.kind == "+":
            return sum(vals)
        if self.kind == "*":
            out = 1
            for v in vals:
                out *= v
            return out
        if self.kind == "%":
            return vals[0] % vals[1]
        if self.kind == "broadcast":
            sizes = {v for v in vals if v != 1}
            if len(sizes) > 1:
                raise ShapeError(f"sizes {', '.join(map(str, vals))} of {self} cannot be "
                                 "broadcast together")
            return sizes.pop() if sizes else 1
        return vals[0] // vals[1]


def _text(d: Dim) -> str:
    return d.text if isinstance(d, DimExpr) else str(int(d))


def _terms(d: Dim, kind: str) -> list[Dim]:
    return list(d.args) if isinstance(d, DimExpr) and d.kind == kind else [d]


def _coef_base(term: DimExpr) -> tuple[int, Dim]:
    """A product term as (constant factor, the rest): 2 * batch -> (2, batch)."""
    if term.kind != "*":
        return 1, term
    const = 1
    syms = []
    for f in term.args:
        if isinstance(f, DimExpr):
            syms.append(f)
        else:
            const *= int(f)
    base = syms[0] if len(syms) == 1 else DimExpr("*", tuple(syms))
    return const, base


def add(a: Dim, b: Dim) -> Dim:
    """Sum with like terms collected: batch + (1 - batch) -> 1."""
    const = 0
    coefs: dict[str, list] = {}
    for t in _terms(a, "+") + _terms(b, "+"):
        if not isinstance(t, DimExpr):
            const += int(t)
            continue
        c, base = _coef_base(t)
        entry = coefs.setdefault(base.text, [0, base])
        entry[0] += c
    terms = []
    for c, base in coefs.values():
        if c == 0:
            continue
        terms.append(base if c == 1 else DimExpr("*", (*_terms(base, "*"), c)))
    if not terms:
        return const
    args = tuple(terms) + ((const,) if const else ())
    return args[0] if len(args) == 1 else DimExpr("+", args)


def mul(a: Dim, b: Dim) -> Dim:
    """Product; a constant times a sum is distributed, so sums stay in one linear form."""
    for x, y in ((a, b), (b, a)):
        if not isinstance(x, DimExpr) and isinstance(y, DimExpr) and y.kind == "+":
            out: Dim = 0
            for t in y.args:
                out = add(out, mul(t, x))
            return out
    factors = _terms(a, "*") + _terms(b, "*")
    const = 1
    for t in factors:
        if not isinstance(t, DimExpr):
            const *= int(t)
    syms = [t for t in factors if isinstance(t, DimExpr)]
    if not syms or const == 0:
        return const
    args = tuple(syms) + ((const,) if const != 1 else ())
    return args[0] if len(args) == 1 else DimExpr("*", args)


def floordiv(a: Dim, b: Dim) -> Dim:
    if not isinstance(a, DimExpr) and not isinstance(b, DimExpr):
        return int(a) // int(b)
    if not isinstance(b, DimExpr) and int(b) > 0 and isinstance(a, DimExpr) and a.kind == "+":
        # (2 * n + 1) // 2 -> n: every symbolic term divides exactly, the constant floors
        d, out, const = int(b), 0, 0
        for t in a.args:
            if not isinstance(t, DimExpr):
                const += int(t)
                continue
            c, base = _coef_base(t)
            if c % d:
                break
            out = add(out, mul(base, c // d))
        else:
            return add(out, const // d)
    # cancel factors the divisor shares with a product: (12 * s) // s -> 12, (s * 6) // 3 -> s * 2
    num, den = _terms(a, "*"), _terms(b, "*")
    num_const = _const_product(num)
    den_const = _const_product(den)
    num_syms = [x for x in num if isinstance(x, DimExpr)]
    rest: list[DimExpr] = []
    for x in (x for x in den if isinstance(x, DimExpr)):
        if x in num_syms:
            num_syms.remove(x)
        else:
            rest.append(x)
    if not rest and num_const % den_const == 0:
        out: Dim = num_const // den_const
        for x in num_syms:
            out = mul(out, x)
        return out
    return DimExpr("//", (a, b))


def mod(a: Dim, b: Dim) -> Dim:
    """Python's ``%`` (the sign of the divisor), folded when both are ints or ``b`` divides every
    term of ``a``: (4 * s) % 2 -> 0."""
    if not isinstance(a, DimExpr) and not isinstance(b, DimExpr):
        return int(a) % int(b)
    if not isinstance(b, DimExpr) and int(b) in (1, -1):
        return 0
    if not isinstance(b, DimExpr) and all(_const_product(_terms(t, "*")) % int(b) == 0
                                          for t in _terms(a, "+")):
        return 0
    return DimExpr("%", (a, b))


def broadcast_dim(a: Dim, b: Dim) -> Dim:
    """The size numpy/ONNX broadcasting gives two sizes: equal ones, or the other where one is 1.

    Two different symbols (``batch`` and ``n``) may be equal or either may be 1, which only real
    sizes tell: the result is the expression ``broadcast(batch, n)``, equal to neither, and a
    plan re-runs the shape rule on the real sizes, where a mismatch is refused naming the node.
    A symbol against a constant other than 1 gives the constant (the symbol must be 1 or it).
    Raises ShapeError for two different constants, neither 1."""
    if not isinstance(a, DimExpr) and int(a) == 1:
        return b
    if not isinstance(b, DimExpr) and int(b) == 1:
        return a
    if dims_equal(a, b):
        return a
    if not isinstance(a, DimExpr) and not isinstance(b, DimExpr):
        raise ShapeError(f"sizes {int(a)} and {int(b)} cannot be broadcast together")
    if not isinstance(a, DimExpr) or not isinstance(b, DimExpr):
        return a if not isinstance(a, DimExpr) else b
    args: list[Dim] = []
    for d in _terms(a, "broadcast") + _terms(b, "broadcast"):
        if d not in args:
            args.append(d)
    return args[0] if len(args) == 1 else DimExpr("broadcast", tuple(args))


def _const_product(terms: list) -> int:
    out = 1
    for x in terms:
        if not isinstance(x, DimExpr):
            out *= int(x)
    return out


def evaluate(d: Dim, bindings: Mapping[str, int]) -> int:
    return d.evaluate(bindings) if isinstance(d, DimExpr) else int(d)


def dims_equal(a: Dim, b: Dim) -> bool:
    if isinstance(a, DimExpr) or isinstance(b, DimExpr):
        return a == b
    return int(a) == int(b)


def may_equal(a: Dim, b: Dim) -> bool:
    """Equal, or sizes only real sizes can tell apart (``seq`` and ``n``, ``seq`` and 16): a rule
    that needs them equal accepts them and the plan, running it on real sizes, checks. Sizes
    that differ by a constant (``seq`` and ``seq + 1``) never are."""
    if not isinstance(a, DimExpr) and not isinstance(b, DimExpr):
        return int(a) == int(b)
    diff = add(a, mul(b, -1))
    return isinstance(diff, DimExpr) or diff == 0


def format_shape(shape: Sequence[Dim]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def numel(shape: Sequence[Dim]) -> Dim:
    out: Dim = 1
    for d in shape:
        out = mul(out, d)
    return out


class SymInt(int):
    """An int that remembers a symbolic dimension: ``tensor.shape[0]`` while tracing.

    Its value is the example size, and its arithmetic with ints and other SymInts is recorded in
    ``expr``, so ``x.shape[0] * 2`` stays symbolic when it reaches a shape argument such as
    ``reshape``. Comparisons made in user code give a :class:`SymBool`, whose truth the tracer
    turns into a guard or refuses; those made inside OneModel give plain bools."""

    expr: Dim

    def __new__(cls, value: int, expr: Dim):
        obj = super().__new__(cls, int(value))
        obj.expr = expr
        return obj

    def _wrap(self, value, expr):
        return SymInt(value, expr) if isinstance(expr, DimExpr) else int(value)

    def __add__(self, o):
        return self._wrap(int(self) + int(o), add(self.expr, _expr(o))) if _is_int(o) else NotImplemented

    __radd__ = __add__

    def __sub__(self, o):
        return self._wrap(int(self) - int(o), add(self.expr, mul(_expr(o), -1))) if _is_int(o) \
            else NotImplemented

    def __rsub__(self, o):
        return self._wrap(int(o) - int(self), add(_expr(o), mul(self.expr, -1))) if _is_int(o) \
            else NotImplemented

    def __mul__(self, o):
        return self._wrap(int(self) * int(o), mul(self.expr, _expr(o))) if _is_int(o) else NotImplemented

    __rmul__ = __mul__

    def __floordiv__(self, o):
        return self._wrap(int(self) // int(o), floordiv(self.expr, _expr(o))) if _is_int(o) \
            else NotImplemented

    def __rfloordiv__(self, o):
        return self._wrap(int(o) // int(self), floordiv(_expr(o), self.expr)) if _is_int(o) \
            else NotImplemented

    def __mod__(self, o):
        return self._wrap(int(self) % int(o), mod(self.expr, _expr(o))) if _is_int(o) \
            else NotImplemented

    # no __rmod__: ``i % size`` (an index wrapped by the axis size) stays an int

    def __neg__(self):
        return self._wrap(-int(self), mul(self.expr, -1))

    # decisions --------------------------------------------------------------------------------
    def _compare(self, o, op: str):
        if isinstance(o, SymInt):
            value, expr = int(o), o.expr
        elif isinstance(o, numbers.Integral):  # int, bool, numpy integers
            value = expr = int(o)
        elif isinstance(o, numbers.Real):
            value = expr = float(o)
        else:
            return NotImplemented
        outcome = _COMPARE[op](int(self), value)
        if trace_state.active is None or internal_file(sys._getframe(2).f_code.co_filename):
            return outcome
        return SymBool(self.expr, op, expr, outcome)

    def __lt__(self, o):
        return self._compare(o, "<")

    def __le__(self, o):
        return self._compare(o, "<=")

    def __gt__(self, o):
        return self._compare(o, ">")

    def __ge__(self, o):
        return self._compare(o, ">=")

    def __eq__(self, o):
        return self._compare(o, "==")

    def __ne__(self, o):
        return self._compare(o, "!=")

    __hash__ = int.__hash__

    def __bool__(self) -> bool:
        if trace_state.active is None or internal_file(sys._getframe(1).f_code.co_filename):
            return int(self) != 0
        return bool(SymBool(self.expr, "!=", 0, int(self) != 0))

    def __pos__(self):
        return self

    def __repr__(self) -> str:
        return f"SymInt({int(self)}, {self.expr})"

    def __reduce__(self):
        return (int, (int(self),))


def _is_int(o) -> bool:
    return isinstance(o, int) and not isinstance(o, bool)


def _expr(o) -> Dim:
    return o.expr if isinstance(o, SymInt) else int(o)


def as_dim(d) -> Dim:
    """The symbolic form of a dim given as an int, a SymInt or a DimExpr."""
    return d.expr if isinstance(d, SymInt) else d


_COMPARE = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
            "==": operator.eq, "!=": operator.ne}
_NEGATE = {"<": ">=", "<=": ">", ">": "<=", ">=": "<", "==": "!=", "!=": "=="}


class SymBool:
    """The outcome of comparing a symbolic size in user code while tracing (``x.shape[0] > 2``).

    It is not a bool on purpose: Python asks for its truth (``if``, ``while``, ``and``, ``not``)
    through ``__bool__``, where the tracer records the outcome as a guard on the graph or, when
    the outcome holds for one size only, refuses it. ``value`` is the outcome at the example."""

    __slots__ = ("lhs", "op", "rhs", "value")

    def __init__(self, lhs: Dim | float, op: str, rhs: Dim | float, value: bool):
        self.lhs, self.op, self.rhs, self.value = lhs, op, rhs, bool(value)

    def holds(self, bindings: Mapping[str, int]) -> bool:
        """Whether the comparison has the example's outcome at ``bindings``."""
        lhs, rhs = (v.evaluate(bindings) if isinstance(v, DimExpr) else v
                    for v in (self.lhs, self.rhs))
        return _COMPARE[self.op](lhs, rhs) == self.value

    def symbols(self) -> set[str]:
        out: set[str] = set()
        for v in (self.lhs, self.rhs):
            if isinstance(v, DimExpr):
                out |= v.symbols()
        return out

    def condition(self) -> str:
        """The condition that holds at the example, as text: ``batch > 2``, ``seq % 2 != 0``."""
        op = self.op if self.value else _NEGATE[self.op]
        return f"{_side(self.lhs)} {op} {_side(self.rhs)}"

    def __bool__(self) -> bool:
        tracer = trace_state.active
        decide = getattr(tracer, "decide", None)
        return self.value if decide is None else bool(decide(self))

    def __int__(self) -> int:
        return int(bool(self))

    __index__ = __int__

    def __eq__(self, other) -> bool:
        return bool(self) == other

    def __ne__(self, other) -> bool:
        return bool(self) != other

    def __hash__(self) -> int:
        return hash(bool(self))

    def __and__(self, other):
        return bool(self) & bool(other)

    __rand__ = __and__

    def __or__(self, other):
        return bool(self) | bool(other)

    __ror__ = __or__

    def __repr__(self) -> str:
        return f"SymBool({self.lhs} {self.op} {self.rhs}: {self.value} at the example)"


def _side(v) -> str:
    return str(v) if isinstance(v, DimExpr) else repr(v)


_INTERNAL: dict[str, bool] = {}


def internal_file(filename: str) -> bool:
    """Whether code in ``filename`` belongs to the onemodel packages (so a decision it makes on a
    size is the library's, not the user's). Cached per file name."""
    hit = _INTERNAL.get(filename)
    if hit is None:
        import onemodel

        dirs = tuple(os.path.join(os.path.abspath(p), "") for p in onemodel.__path__)
        path = os.path.abspath(filename)
        hit = path.startswith(dirs) or filename.startswith("<frozen")
        _INTERNAL[filename] = hit
    return hit
