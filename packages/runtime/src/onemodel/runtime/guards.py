"""Checking a graph's guards: the conditions on symbolic sizes that tracing recorded.

A guard is text such as ``batch > 2`` or ``seq % 2 == 0`` (sizes, ints, ``+ - * // %``,
parentheses, one comparison). It is read here by a small evaluator, never by ``eval``, so a
file's guards cannot run code. The Session calls :func:`check_guards` once per plan.
"""

from __future__ import annotations

import json
import operator
import re
from collections.abc import Mapping

from onemodel.tensors import OneModelError

from .graph import Graph, Guard

_TOKEN = re.compile(r"\s*(?:(\d+\.\d*|\d+)|([A-Za-z_][A-Za-z0-9_.:]*)|(//|==|!=|<=|>=|[-+*%()<>]))")
_COMPARE = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
            "==": operator.eq, "!=": operator.ne}
_ARITH = {"+": operator.add, "-": operator.sub, "*": operator.mul, "//": operator.floordiv,
          "%": operator.mod}


_MAX_TEXT = 400  # characters in one guard: the tracer writes short ones; a file may not nest deep
METADATA_KEY = "onemodel.guards"  # ONNX metadata_props key holding guards_to_json(...)


class GuardError(OneModelError):
    """Input sizes break a guard: the graph was traced under a decision that does not hold."""


def evaluate_condition(condition: str, bindings: Mapping[str, int]) -> bool:
    """Whether ``condition`` holds for the symbol sizes in ``bindings``."""
    tokens = _tokens(condition)
    parser = _Parser(tokens, condition, bindings)
    lhs = parser.sum()
    op = parser.take()
    if op not in _COMPARE:
        raise OneModelError(f"cannot read the guard {condition!r}: expected a comparison")
    rhs = parser.sum()
    if parser.i != len(tokens):
        raise OneModelError(f"cannot read the guard {condition!r}")
    return bool(_COMPARE[op](lhs, rhs))


def _holds(condition: str, bindings: Mapping[str, int]) -> bool:
    try:
        return evaluate_condition(condition, bindings)
    except ZeroDivisionError:  # a size that makes the guard's own arithmetic undefined
        return False


def failed_guard(guards: list[Guard], bindings: Mapping[str, int]) -> Guard | None:
    """The first guard that does not hold at ``bindings``, or None."""
    for g in guards:
        if not _holds(g.condition, bindings):
            return g
    return None


def check_guards(graph: Graph, bindings: Mapping[str, int]) -> None:
    """Raise :class:`GuardError` naming the axis, the guard and the user's source line when the
    sizes in ``bindings`` break one of ``graph``'s guards."""
    guards = getattr(graph, "guards", None)
    if not guards:
        return
    g = failed_guard(guards, bindings)
    if g is None:
        return
    sizes = ", ".join(f"{s}={bindings[s]}" for s in g.axis.split(", ") if s in bindings)
    raise GuardError(
        f"input sizes {sizes} break the guard '{g.condition}' on axis {g.axis!r}: the graph was "
        f"traced under a Python decision on that size made at {g.location}, so it is valid only "
        f"where {g.condition}. Feed sizes where it holds, or trace a graph for these sizes (or "
        "replace the decision with tensor ops such as where())")


def guards_to_list(guards: list[Guard]) -> list[dict]:
    """Guards as plain data for a file header."""
    return [{"condition": g.condition, "axis": g.axis, "location": g.location} for g in guards]


def guards_from_list(data) -> list[Guard]:
    """Guards read back from a file; a malformed entry is a OneModelError (a file without
    guards gives ``[]``)."""
    if not isinstance(data, list):
        raise OneModelError("the guards are not a list")
    out = []
    for e in data:
        if not isinstance(e, dict) or not all(isinstance(e.get(k), str)
                                              for k in ("condition", "axis", "location")):
            raise OneModelError(f"a guard is malformed: {e!r}")
        if len(e["condition"]) > _MAX_TEXT or e["condition"].count("(") > 40:
            raise OneModelError(f"a guard is longer than {_MAX_TEXT} characters or nests deeper "
                                "than 40 parentheses")
        _holds(e["condition"], _Ones())  # readable: one comparison of size arithmetic
        out.append(Guard(e["condition"], e["axis"], e["location"]))
    return out


class _Ones(dict):
    """Every size is 1: enough to check that a condition reads."""

    def __missing__(self, key):
        return 1


def guards_to_json(guards: list[Guard]) -> str:
    return json.dumps(guards_to_list(guards), separators=(",", ":"))


def guards_from_json(text: str) -> list[Guard]:
    try:
        data = json.loads(text)
    except ValueError:
        raise OneModelError(f"the guards in metadata {METADATA_KEY!r} are not JSON") from None
    return guards_from_list(data)


def _tokens(text: str) -> list:
    out, pos = [], 0
    while pos < len(text):
        if text[pos:].isspace():
            break
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise OneModelError(f"cannot read the guard {text!r} at {text[pos:]!r}")
        num, name, sym = m.groups()
        if num is not None:
            out.append(float(num) if "." in num else int(num))
        else:
            out.append(("name", name) if name is not None else sym)
        pos = m.end()
    return out


class _Parser:
    def __init__(self, tokens, text, bindings):
        self.tokens, self.i, self.text, self.bindings = tokens, 0, text, bindings

    def peek(self):
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self):
        tok = self.peek()
        if tok is None:
            raise OneModelError(f"cannot read the guard {self.text!r}: it ends too early")
        self.i += 1
        return tok

    def sum(self):
        out = self.product()
        while self.peek() in ("+", "-"):
            op = self.take()
            out = _ARITH[op](out, self.product())
        return out

    def product(self):
        out = self.atom()
        while self.peek() in ("*", "//", "%"):
            op = self.take()
            out = _ARITH[op](out, self.atom())
        return out

    def atom(self):
        tok = self.take()
        if tok == "(":
            out = self.sum()
            if self.take() != ")":
                raise OneModelError(f"cannot read the guard {self.text!r}: unbalanced parentheses")
            return out
        if tok == "-":
            return -self.atom()
        if isinstance(tok, tuple):
            try:
                return int(self.bindings[tok[1]])
            except KeyError:
                raise OneModelError(f"the guard {self.text!r} names size {tok[1]!r}, which no "
                                    "input of the graph binds") from None
        if isinstance(tok, (int, float)):
            return tok
        raise OneModelError(f"cannot read the guard {self.text!r} at {tok!r}")
