"""Text form of dims: ints, symbol names and expressions such as ``2 * batch + 1``.

Files (native and ONNX) store symbolic dims as text; this parses them back into ``DimExpr``."""

from __future__ import annotations

import re

from onemodel.tensors import DimExpr, OneModelError
from onemodel.tensors.symbolic import Dim, add, floordiv, mul

_TOKEN = re.compile(r"\s*(?:(\d+)|([A-Za-z_][A-Za-z0-9_.:\-]*)|(//|[-+*()]))")


def dim_to_text(d: Dim) -> int | str:
    return int(d) if not isinstance(d, DimExpr) else str(d)


def parse_dim(value: int | str) -> Dim:
    """An int stays an int; a name becomes a symbol; an expression is parsed."""
    if isinstance(value, int):
        return value
    text = str(value).strip()
    if text.lstrip("-").isdigit():
        return int(text)
    tokens = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise OneModelError(f"cannot read the dimension {value!r}")
        tokens.append(m.group(1) or m.group(2) or m.group(3))
        pos = m.end()
    parser = _Parser(tokens, value)
    out = parser.sum()
    if parser.i != len(tokens):
        raise OneModelError(f"cannot read the dimension {value!r}")
    return out


class _Parser:
    def __init__(self, tokens, original):
        self.tokens, self.i, self.original = tokens, 0, original

    def peek(self):
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self):
        tok = self.peek()
        if tok is None:
            raise OneModelError(f"cannot read the dimension {self.original!r}")
        self.i += 1
        return tok

    def sum(self) -> Dim:
        out = self.product()
        while self.peek() in ("+", "-"):
            op = self.take()
            rhs = self.product()
            out = add(out, rhs if op == "+" else mul(rhs, -1))
        return out

    def product(self) -> Dim:
        out = self.atom()
        while self.peek() in ("*", "//"):
            op = self.take()
            rhs = self.atom()
            out = mul(out, rhs) if op == "*" else floordiv(out, rhs)
        return out

    def atom(self) -> Dim:
        tok = self.take()
        if tok == "(":
            out = self.sum()
            if self.take() != ")":
                raise OneModelError(f"cannot read the dimension {self.original!r}")
            return out
        if tok == "-":
            return mul(self.atom(), -1)
        if tok.isdigit():
            return int(tok)
        if tok in ("+", "*", "//", ")"):
            raise OneModelError(f"cannot read the dimension {self.original!r}")
        return DimExpr.symbol(tok)
