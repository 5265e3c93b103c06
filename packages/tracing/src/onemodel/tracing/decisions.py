"""Python decisions on symbolic sizes: which ones become guards and which ones are refused.

A comparison of symbolic sizes used as a bool (``if x.shape[0] > 2``) has one outcome at the
example. It is tried over a sample of sizes for each symbol it names (the others kept at their
example sizes): every size from 0 to 64, the powers of two up to 2**40 and their neighbours, the
example sizes and every constant of the comparison with its neighbours. If the outcome holds at
every sampled size it is a fact about sizes, not a decision (``batch >= 0``); if it holds at one
size only, it pins the axis (``seq == 4``) and is refused; otherwise it is a guard.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from onemodel.tensors import DimExpr
from onemodel.tensors.symbolic import SymBool

_BASE_SAMPLE = frozenset(range(65)) | frozenset(
    v for k in range(6, 41) for v in (2 ** k - 1, 2 ** k, 2 ** k + 1))


@dataclass(frozen=True)
class Verdict:
    """``kind`` is "always" (no guard needed), "guard", or "pin" (then ``axis`` = ``size``)."""

    kind: str
    axis: str = ""
    size: int = 0


def classify(decision: SymBool, examples: Mapping[str, int]) -> Verdict:
    """What to do with ``decision`` given the example size of each symbol."""
    symbols = sorted(decision.symbols())
    if not symbols:
        return Verdict("always")
    sample = _sample(decision, examples)
    always = True
    for sym in symbols:
        held = []
        for size in sample:
            try:
                if decision.holds({**examples, sym: size}):
                    held.append(size)
            except ZeroDivisionError:
                continue
            if len(held) > 1 and not always:
                break
        if len(held) == 1:
            return Verdict("pin", sym, held[0])
        if len(held) < len(sample):
            always = False
    return Verdict("always" if always else "guard")


def _sample(decision: SymBool, examples: Mapping[str, int]) -> list[int]:
    extra: set[int] = set()
    for c in _constants(decision.lhs) + _constants(decision.rhs) + list(examples.values()):
        c = abs(int(c))
        extra.update((c - 1, c, c + 1, 2 * c))
    return sorted(_BASE_SAMPLE | {v for v in extra if v >= 0})


def _constants(d) -> list:
    if isinstance(d, DimExpr):
        if d.kind == "sym":
            return []
        return [c for a in d.args for c in _constants(a)]
    return [d]
