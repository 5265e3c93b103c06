"""Kernel choice is one function (registry.choose_kernel), used by eager dispatch and the
planner alike: a plugin kernel with a ``supports`` check wins where it accepts the call, and the
reference kernel is the fallback everywhere else."""

from __future__ import annotations

import numpy as np

from onemodel.runtime import GraphBuilder, Session
from onemodel.tensors import DType, Tensor
from onemodel.tensors.registry import hookimpl

CALLS: list[str] = []


def doubled_relu(x):
    CALLS.append("plugin")
    return np.maximum(x, 0) * 2  # deliberately different, so the choice is visible


def only_rank_2(x):
    return x.ndim == 2


class Plugin:
    @hookimpl
    def onemodel_register_kernels(self, register):
        register("Relu", f"{__name__}:doubled_relu", dtypes=["F32"], priority=10,
                 supports=f"{__name__}:only_rank_2")


def test_eager_and_planner_make_the_same_choice(isolated_registry):
    isolated_registry.register_plugin(Plugin(), "choice-test")
    x2 = np.array([[-1.0, 2.0]], np.float32)
    x3 = x2.reshape(1, 1, 2)
    eager2 = Tensor.from_numpy(x2).relu().numpy()
    eager3 = Tensor.from_numpy(x3).relu().numpy()
    np.testing.assert_array_equal(eager2, [[0, 4]])  # the plugin's kernel
    np.testing.assert_array_equal(eager3, [[[0, 2]]])  # refused: the reference kernel

    for x, want in ((x2, eager2), (x3, eager3)):
        b = GraphBuilder()
        v = b.input("x", DType.F32, x.shape)
        b.output(b.op("Relu", v), "y")
        got = Session(b.build(), optimize=False).run({"x": x})["y"].numpy()
        np.testing.assert_array_equal(got, want)
    # int64 is not among the plugin kernel's dtypes: reference kernel, no supports call
    CALLS.clear()
    np.testing.assert_array_equal(Tensor.from_numpy(np.array([[-3, 3]])).relu().numpy(), [[0, 3]])
    assert CALLS == []
