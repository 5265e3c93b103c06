"""``Session.warmup``: builds the plan for the given shapes and runs it once, so the first real
request neither plans nor compiles; it refuses incomplete or unknown shapes."""

from __future__ import annotations

import numpy as np
import pytest
from runtime_graphs import conv_net, eager, random_feeds

from onemodel.runtime import GraphBuilder, Session, planner
from onemodel.tensors import DType, OneModelError


def test_warmup_builds_and_runs_the_plan_that_run_then_reuses(monkeypatch):
    s = Session(conv_net())
    executed = []
    real = planner.Plan.execute

    def spy(plan, arrays):
        executed.append([a.copy() for a in arrays])
        return real(plan, arrays)

    monkeypatch.setattr(planner.Plan, "execute", spy)
    plan = s.warmup({"input": (3, 3, 16, 16)})
    assert plan.bindings == {"batch": 3}
    assert len(executed) == 1 and executed[0][0].shape == (3, 3, 16, 16)
    assert not executed[0][0].any()  # it ran on zeros
    assert s.cache_info().builds == 1
    feeds = random_feeds(s.source_graph, {"batch": 3}, seed=4)
    got = s.run(feeds)["output"].numpy()
    info = s.cache_info()
    assert info.builds == 1 and info.hits >= 1  # the warmed plan served the run
    np.testing.assert_allclose(got, eager(s.source_graph, feeds)["output"], rtol=1e-5, atol=1e-5)
    s.run(random_feeds(s.source_graph, {"batch": 5}, seed=4))
    assert s.cache_info().builds == 2  # other shapes still get their own plans


def test_warmup_on_zeros_is_quiet_where_zeros_divide_by_zero():
    b = GraphBuilder()
    x = b.input("x", DType.F32, ("n",))
    b.output(b.op("Div", x, x), "y")
    s = Session(b.build())
    with np.errstate(all="raise"):
        s.warmup({"x": (4,)})
    np.testing.assert_array_equal(s.run({"x": np.full(4, 2, np.float32)})["y"].numpy(), 1)


def test_warmup_refuses_missing_and_unknown_inputs():
    s = Session(conv_net())
    with pytest.raises(OneModelError, match="no shape given for input 'input'"):
        s.warmup({})
    with pytest.raises(OneModelError, match="unknown input 'x'"):
        s.warmup({"input": (1, 3, 16, 16), "x": (2,)})
    with pytest.raises(OneModelError, match="input 'input'"):
        s.warmup({"input": (1, 4, 16, 16)})  # a fixed axis of the wrong size
