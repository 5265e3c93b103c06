"""Guards: the evaluator reads the conditions tracing writes (never with eval), the Session checks
them at plan time, and files carry them as plain data."""

from __future__ import annotations

import numpy as np
import pytest

from onemodel.runtime import GraphBuilder, Session
from onemodel.runtime.graph import Guard
from onemodel.runtime.guards import (
    GuardError,
    evaluate_condition,
    failed_guard,
    guards_from_json,
    guards_from_list,
    guards_to_json,
)
from onemodel.tensors import OneModelError


@pytest.mark.parametrize("condition,bindings,want", [
    ("batch > 2", {"batch": 3}, True),
    ("batch > 2", {"batch": 2}, False),
    ("seq % 2 == 0", {"seq": 6}, True),
    ("seq % 2 != 0", {"seq": 6}, False),
    ("(2 * batch) + 1 < 20", {"batch": 9}, True),
    ("(2 * batch) + 1 < 20", {"batch": 10}, False),
    ("batch + (seq * -1) <= 0", {"batch": 3, "seq": 3}, True),
    ("batch // 3 >= 2", {"batch": 5}, False),
    ("batch > 2.5", {"batch": 3}, True),
    ("-batch < -3", {"batch": 4}, True),
])
def test_conditions_evaluate_like_python(condition, bindings, want):
    assert evaluate_condition(condition, bindings) is want
    assert eval(condition, {}, dict(bindings)) is want  # the oracle: Python itself


@pytest.mark.parametrize("bad", ["batch", "batch > ", "__import__('os') > 1", "batch > 2 > 1",
                                 "(batch > 2", "batch >> 2"])
def test_unreadable_conditions_are_errors(bad):
    with pytest.raises(OneModelError):
        evaluate_condition(bad, {"batch": 3})


def test_a_guard_naming_an_unbound_size_is_an_error():
    with pytest.raises(OneModelError, match="names size 'seq', which no input"):
        evaluate_condition("seq > 1", {"batch": 3})


def test_failed_guard_and_division_by_zero():
    guards = [Guard("batch > 1", "batch", "m.py:3"), Guard("seq % batch == 0", "batch, seq",
                                                           "m.py:4")]
    assert failed_guard(guards, {"batch": 2, "seq": 4}) is None
    assert failed_guard(guards, {"batch": 2, "seq": 5}) is guards[1]
    assert failed_guard(guards[1:], {"batch": 0, "seq": 5}) is guards[1]  # undefined: broken


def test_round_trip_and_malformed_data():
    guards = [Guard("batch > 2", "batch", "/src/model.py:12")]
    assert guards_from_json(guards_to_json(guards)) == guards
    assert guards_from_list([]) == []
    for bad in ("{}", '[{"condition": "batch > 2"}]', '[{"condition": 1, "axis": "b", '
                '"location": ""}]', '[{"condition": "import os", "axis": "b", "location": ""}]',
                "not json", '[{"condition": "' + "(" * 500 + '", "axis": "b", "location": ""}]',
                '[{"condition": "' + "(" * 60 + "b" + ")" * 60 + ' > 1", "axis": "b", '
                '"location": ""}]'):
        with pytest.raises(OneModelError):
            guards_from_json(bad)


def test_the_session_checks_guards_when_it_plans():
    b = GraphBuilder("g")
    x = b.input("x", "F32", ("batch", 2))
    b.output(b.op("Relu", x), "y")
    graph = b.build()
    graph.guards.append(Guard("batch % 2 == 0", "batch", "/src/model.py:7"))
    assert "guard  batch % 2 == 0  (axis batch, decided at /src/model.py:7)" in str(graph)
    assert graph.copy().guards == graph.guards
    session = Session(graph)
    x4 = np.array([[-1, 2]] * 4, np.float32)
    np.testing.assert_array_equal(session.run({"x": x4})["y"].numpy(), np.maximum(x4, 0))
    with pytest.raises(GuardError) as err:
        session.run({"x": np.ones((3, 2), np.float32)})
    msg = str(err.value)
    assert "batch=3" in msg and "'batch % 2 == 0'" in msg and "axis 'batch'" in msg
    assert "/src/model.py:7" in msg
