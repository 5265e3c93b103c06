"""SymInt comparisons and ``%``: outside a trace and in OneModel's own code they are plain bools;
in user code while a trace runs they are SymBools whose truth the tracer decides; ``%`` keeps the
symbol. Also the Range shape rule over a symbolic bound."""

from __future__ import annotations

import operator

import pytest

import onemodel.tensors.trace_state as trace_state
from onemodel.tensors import OPS, DimExpr, DType, ShapeError, TensorSpec
from onemodel.tensors.symbolic import SymBool, SymInt, evaluate, internal_file

B = DimExpr.symbol("batch")
S = DimExpr.symbol("seq")


class RecordingTracer:
    """Stands in for the tracer: records each decision it is asked for."""

    def __init__(self):
        self.asked: list[SymBool] = []

    def decide(self, decision: SymBool) -> bool:
        self.asked.append(decision)
        return decision.value


@pytest.fixture
def tracer():
    prev = trace_state.active
    trace_state.active = RecordingTracer()
    try:
        yield trace_state.active
    finally:
        trace_state.active = prev


def test_outside_a_trace_comparisons_are_plain_bools():
    b = SymInt(4, B)
    for op in (operator.lt, operator.le, operator.gt, operator.ge, operator.eq, operator.ne):
        for other in (3, 4, 5, 4.5, SymInt(4, S)):
            got = op(b, other)
            assert type(got) is bool and got == op(4, other)
    assert bool(b) is True and hash(b) == hash(4) and {b: 1}[4] == 1


@pytest.mark.parametrize("expr,value,condition", [
    (lambda b: b > 2, True, "batch > 2"),
    (lambda b: b <= 2, False, "batch > 2"),
    (lambda b: 2 < b, True, "batch > 2"),  # noqa: SIM300 - reflected: the SymInt decides
    (lambda b: b == 4, True, "batch == 4"),
    (lambda b: b != 5, True, "batch != 5"),
    (lambda b: b != 4, False, "batch == 4"),
    (lambda b: b % 2 == 0, True, "batch % 2 == 0"),
    (lambda b: b % 3 == 0, False, "batch % 3 != 0"),
    (lambda b: b * 2 + 1 < 20, True, "(2 * batch) + 1 < 20"),
    (lambda b: b > 2.5, True, "batch > 2.5"),
])
def test_in_user_code_a_comparison_is_a_symbool_decided_by_the_tracer(tracer, expr, value,
                                                                        condition):
    result = expr(SymInt(4, B))
    assert isinstance(result, SymBool) and not tracer.asked
    assert bool(result) is value
    (asked,) = tracer.asked
    assert asked.condition() == condition
    assert asked.holds({"batch": 4}) and asked.symbols() == {"batch"}


def test_a_symint_as_a_bool_is_a_decision(tracer):
    assert bool(SymInt(3, B)) is True
    assert tracer.asked[0].condition() == "batch != 0"


def test_holds_evaluates_the_outcome_at_other_sizes(tracer):
    d = SymInt(4, B) % 2 == 0
    assert [d.holds({"batch": n}) for n in range(1, 7)] == [False, True, False, True, False, True]
    two = SymInt(4, B) < SymInt(5, S)
    assert two.condition() == "batch < seq" and two.symbols() == {"batch", "seq"}
    assert two.holds({"batch": 1, "seq": 9}) and not two.holds({"batch": 9, "seq": 1})


def test_modulo_keeps_the_symbol_and_folds_what_it_can(tracer):
    r = SymInt(7, B) % 3
    assert isinstance(r, SymInt) and int(r) == 1 and str(r.expr) == "batch % 3"
    assert evaluate(r.expr, {"batch": 11}) == 2
    assert (B * 4) % 2 == 0 and B % 1 == 0 and 7 % SymInt(4, B) == 3  # int % size stays an int
    assert type(7 % SymInt(4, B)) is int


def test_code_inside_onemodel_gets_plain_bools(tracer):
    assert internal_file(trace_state.__file__) and not internal_file(__file__)
    namespace: dict = {}
    exec(compile("def cmp(a): return a > 2", trace_state.__file__, "exec"), namespace)
    assert namespace["cmp"](SymInt(4, B)) is True and not tracer.asked


def test_symbool_works_in_boolean_contexts(tracer):
    b = SymInt(4, B)
    assert (b > 2) and not (b < 2)
    assert ((b > 2) & (b < 9)) is True and ((b > 2) | (b > 9)) is True
    assert (b > 2) == True  # noqa: E712 - comparing the SymBool itself
    assert int(b > 2) == 1 and [0, 1][b > 2] == 1


def test_range_over_a_symbolic_bound_has_a_symbolic_length():
    def i64(value):
        return TensorSpec((), DType.I64, (value,))

    (out,) = OPS["Range"].infer([i64(0), i64(S), i64(1)])
    assert out.shape == (S,)
    (out,) = OPS["Range"].infer([i64(1), i64(S), i64(2)])
    assert evaluate(out.shape[0], {"seq": 4}) == 2 and evaluate(out.shape[0], {"seq": 5}) == 2
    (out,) = OPS["Range"].infer([i64(S), i64(0), i64(-2)])  # a countdown: ceil(seq / 2)
    assert [evaluate(out.shape[0], {"seq": n}) for n in (4, 5)] == [len(range(4, 0, -2)),
                                                                   len(range(5, 0, -2))]
    with pytest.raises(ShapeError, match="constant non-zero step"):
        OPS["Range"].infer([i64(0), i64(S), i64(0)])


def test_floor_division_of_a_sum_divides_exact_terms():
    n, m = DimExpr.symbol("n"), DimExpr.symbol("m")
    for expr, oracle in [((2 * n + 1) // 2, lambda n, m: (2 * n + 1) // 2),
                         ((4 * n + 6 * m + 3) // 2, lambda n, m: (4 * n + 6 * m + 3) // 2),
                         ((2 * n - 1) // 2, lambda n, m: (2 * n - 1) // 2),
                         ((n + 1) // 2, lambda n, m: (n + 1) // 2)]:
        for a in range(0, 7):
            assert evaluate(expr, {"n": a, "m": 3}) == oracle(a, 3)
    assert (2 * n + 1) // 2 == n and str((n + 1) // 2) == "(1 + n) // 2"
