"""Constant folding: nodes whose inputs are all known become initializers.

A node is folded only when its shape rule says, before anything is computed, that its outputs
are small (``MAX_ELEMENTS`` in all): folding must never allocate more than the graph holds."""

from __future__ import annotations

import math

import numpy as np

from onemodel.tensors import DType, OneModelError, TensorSpec
from onemodel.tensors.ops import OPS

from ..graph import Graph, small_value
from .base import Pass, PassResult

MAX_ELEMENTS = 1 << 22  # elements of a folded node's outputs, all together


class ConstantFolding(Pass):
    name = "constant-folding"
    level = "basic"
    changes = ("evaluates nodes whose inputs are all initializers (and Shape of a static shape) "
               "and stores their outputs as initializers")

    def run(self, graph: Graph) -> PassResult:
        specs = None
        folded = 0
        for n in list(graph.nodes):
            op = OPS.get(n.op)
            if op is None or not op.foldable:  # random, or far more data out than in
                continue
            if n.op == "Shape":
                if specs is None:
                    specs = graph.validate(allow_unknown=True)
                if specs[n.inputs[0]] is None:
                    continue
                shape = specs[n.inputs[0]].shape
                if not all(isinstance(d, int) for d in shape):
                    continue
                try:  # a zero-stride stand-in: Shape reads no data, so allocate none
                    args = [np.broadcast_to(np.zeros((), np.int8), shape)]
                except ValueError:
                    continue
            elif all((not i) or i in graph.initializers for i in n.inputs) and n.inputs:
                args = [graph.initializers[i] if i else None for i in n.inputs]
            else:
                continue
            op = OPS[n.op]
            if n.op != "Shape" and not _small_outputs(op, args, n.attrs):
                continue
            try:
                out = op.kernel(*args, **n.attrs)
            except (OneModelError, ArithmeticError, ValueError, TypeError, IndexError):
                continue  # left in the graph: validation or the run names the node
            outs = out if isinstance(out, tuple) else (out,)
            if sum(np.asarray(o).size for o in outs) > MAX_ELEMENTS:
                continue
            for name, value in zip(n.outputs, outs):
                if name:
                    graph.initializers[name] = np.asarray(value)
            graph.nodes.remove(n)
            folded += 1
        return PassResult(folded)


def _small_outputs(op, args, attrs) -> bool:
    """Whether the shape rule gives ``op`` static output shapes of at most MAX_ELEMENTS in all."""
    specs = []
    for a in args:
        if a is None:
            specs.append(None)
            continue
        try:
            dtype = DType.from_numpy(a.dtype)
        except OneModelError:
            return False
        specs.append(TensorSpec(tuple(a.shape), dtype, small_value(a)))
    try:
        outs = op.infer(specs, attrs)
    except OneModelError:
        return False
    total = 0
    for spec in outs:
        if spec is None or not all(isinstance(d, int) for d in spec.shape):
            return False  # data-dependent size (NonZero...): unknown before computing
        total += math.prod(spec.shape)
    return total <= MAX_ELEMENTS
