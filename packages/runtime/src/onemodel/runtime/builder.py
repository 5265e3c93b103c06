"""``GraphBuilder``: write graphs by hand (tests, examples, importers)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from onemodel.tensors import DimExpr, DType
from onemodel.tensors.symbolic import Dim

from .graph import Graph, Node, ValueInfo


class GraphBuilder:
    """``b.input("x", DType.F32, ("batch", 784))``, ``h = b.op("Gemm", x, w, bias, transB=1)``,
    ``b.output(h, "y")``, then ``b.build()``."""

    def __init__(self, name: str = "graph"):
        self.graph = Graph(name=name)
        self._count = 0

    def input(self, name: str, dtype: DType, shape: Sequence[int | str | Dim]) -> str:
        dims = tuple(DimExpr.symbol(d) if isinstance(d, str) else d for d in shape)
        self.graph.inputs.append(ValueInfo(name, DType.of(dtype), dims))
        return name

    def initializer(self, name: str, value) -> str:
        self.graph.initializers[name] = np.asarray(value)
        return name

    def const(self, value, dtype=None) -> str:
        arr = np.asarray(value, dtype=None if dtype is None else DType.of(dtype).numpy)
        return self.initializer(self._name("const"), arr)

    def op(self, op: str, *inputs: str | None, outputs: int = 1, name: str | None = None,
           **attrs):
        outs = [self._name(op.lower()) for _ in range(outputs)]
        self.graph.nodes.append(Node(op, [i or "" for i in inputs], outs, attrs,
                                     name or self._name(f"{op}_node")))
        return outs[0] if outputs == 1 else tuple(outs)

    def output(self, value: str, name: str | None = None) -> str:
        if name is not None and name != value:
            value = self.op("Identity", value, name=f"{name}_identity")
            self.graph.nodes[-1].outputs[0] = name
            value = name
        specs = self.graph.validate()
        spec = specs[value]
        self.graph.outputs.append(ValueInfo(value, spec.dtype, spec.shape))
        return value

    def build(self) -> Graph:
        self.graph.validate()
        return self.graph

    def _name(self, base: str) -> str:
        self._count += 1
        return f"{base}_{self._count}"
