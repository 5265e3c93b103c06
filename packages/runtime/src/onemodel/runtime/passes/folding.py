"""Constant folding: nodes whose inputs are all known become initializers."""

from __future__ import annotations

import numpy as np

from onemodel.tensors.ops import OPS

from ..graph import Graph
from .base import Pass, PassResult

# ops never folded: random, or producing far more data than they read
_NEVER = {"Dropout", "Expand", "ConstantOfShape", "Tile"}
_MAX_ELEMENTS = 1 << 22


class ConstantFolding(Pass):
    name = "constant-folding"
    changes = ("evaluates nodes whose inputs are all initializers (and Shape of a static shape) "
               "and stores their outputs as initializers")

    def run(self, graph: Graph) -> PassResult:
        specs = None
        folded = 0
        for n in list(graph.nodes):
            if n.op in _NEVER:
                continue
            if n.op == "Shape":
                if specs is None:
                    specs = graph.validate(allow_unknown=True)
                if specs[n.inputs[0]] is None:
                    continue
                shape = specs[n.inputs[0]].shape
                if not all(isinstance(d, int) for d in shape):
                    continue
                args = [np.empty(shape, np.int8)]
            elif all((not i) or i in graph.initializers for i in n.inputs) and n.inputs:
                args = [graph.initializers[i] if i else None for i in n.inputs]
            else:
                continue
            op = OPS[n.op]
            out = op.kernel(*args, **n.attrs)
            outs = out if isinstance(out, tuple) else (out,)
            if sum(np.asarray(o).size for o in outs) > _MAX_ELEMENTS:
                continue
            for name, value in zip(n.outputs, outs):
                if name:
                    graph.initializers[name] = np.asarray(value)
            graph.nodes.remove(n)
            folded += 1
        return PassResult(folded)
