"""Text form of dims: ints, symbol names and expressions such as ``2 * batch + 1`` or
``broadcast(batch, n)``.

Files (native and ONNX) store symbolic dims as text; this parses them back into ``DimExpr``.
Text comes from files that may be hostile, so the parser is bounded (length, nesting, digits) and
every failure is a ``OneModelError``."""

from __future__ import annotations

import re

from onemodel.tensors import DimExpr, OneModelError
from onemodel.tensors.symbolic import Dim, add, broadcast_dim, floordiv, mul

_TOKEN = re.compile(r"\s*(?:([0-9]+)|([A-Za-z_][A-Za-z0-9_.:\-]*)|(//|[-+*(),]))", re.ASCII)
_MAX_TEXT = 1000  # characters of one dimension's text
_MAX_DEPTH = 32  # nested parentheses and unary minus signs
_MAX_DIGITS = 18  # an integer literal below 10**18 (and 2**63)


def dim_to_text(d: Dim) -> int | str:
    return int(d) if not isinstance(d, DimExpr) else str(d)


def parse_dim(value: int | str) -> Dim:
    """An int stays an int; a name becomes a symbol; an expression is parsed."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise OneModelError(f"cannot read the dimension {value!r}: expected a whole number or "
                            "the text of a symbolic size")
    if isinstance(value, int):
        if not 0 <= value < 1 << 62:
            raise OneModelError(f"the dimension {value} is out of range")
        return value
    text = value.strip()
    if len(text) > _MAX_TEXT:
        raise OneModelError(f"cannot read the dimension {text[:40]!r}...: longer than "
                            f"{_MAX_TEXT} characters")
    tokens = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise OneModelError(f"cannot read the dimension {value!r}")
        tok = m.group(1) or m.group(2) or m.group(3)
        if m.group(1) and len(tok) > _MAX_DIGITS:
            raise OneModelError(f"cannot read the dimension {value!r}: a number with more than "
                                f"{_MAX_DIGITS} digits")
        tokens.append(tok)
        pos = m.end()
    parser = _Parser(tokens, value)
    try:
        out = parser.sum()
    except (ArithmeticError, ValueError, TypeError) as exc:
        raise OneModelError(f"cannot read the dimension {value!r} ({exc})") from None
    if parser.i != len(tokens):
        raise OneModelError(f"cannot read the dimension {value!r}")
    if isinstance(out, int) and out < 0:
        raise OneModelError(f"the dimension {value!r} is negative")
    return out


class _Parser:
    def __init__(self, tokens, original):
        self.tokens, self.i, self.original, self.depth = tokens, 0, original, 0

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
            if op == "//" and isinstance(rhs, int) and rhs <= 0:
                raise OneModelError(f"cannot read the dimension {self.original!r}: division by "
                                    f"{rhs}")
            out = mul(out, rhs) if op == "*" else floordiv(out, rhs)
        return out

    def atom(self) -> Dim:
        tok = self.take()
        if tok in ("(", "-"):
            self.depth += 1
            if self.depth > _MAX_DEPTH:
                raise OneModelError(f"cannot read the dimension {self.original!r}: nested more "
                                    f"than {_MAX_DEPTH} deep")
            if tok == "-":
                out = mul(self.atom(), -1)
            else:
                out = self.sum()
                if self.take() != ")":
                    raise OneModelError(f"cannot read the dimension {self.original!r}")
            self.depth -= 1
            return out
        if tok.isdigit():
            return int(tok)
        if tok == "broadcast" and self.peek() == "(":  # broadcast(a, b, ...)
            self.take()
            self.depth += 1
            if self.depth > _MAX_DEPTH:
                raise OneModelError(f"cannot read the dimension {self.original!r}: nested more "
                                    f"than {_MAX_DEPTH} deep")
            out = self.sum()
            while self.peek() == ",":
                self.take()
                out = broadcast_dim(out, self.sum())
            if self.take() != ")":
                raise OneModelError(f"cannot read the dimension {self.original!r}")
            self.depth -= 1
            return out
        if tok in ("+", "*", "//", ")", ","):
            raise OneModelError(f"cannot read the dimension {self.original!r}")
        return DimExpr.symbol(tok)
