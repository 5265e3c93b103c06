"""Elementwise fusion: a chain of elementwise ops (bias, activation, residual add, scale, clip)
becomes one ``FusedElementwise`` node, which a kernel plugin runs in a single pass over memory
instead of one pass and one temporary per op. A kernel plugin registers this pass along with
the kernel that makes it pay (``onemodel-numba`` does); the reference kernel runs the steps one
by one, so a graph fused here still runs without the plugin."""

from __future__ import annotations

import numpy as np

from onemodel.tensors import DType
from onemodel.tensors.ops import OPS
from onemodel.tensors.ops.fused import chain_operands

from ..graph import Graph, Node
from .base import Pass, PassResult, Uses, same_spec

_FLOATS = (DType.F32, DType.F64)


def _op(n: Node) -> str:
    """The chain op a node computes: a two-input Sum (a residual add in ONNX files) is Add."""
    return "Add" if n.op == "Sum" and len(n.inputs) == 2 else n.op


class ElementwiseFusion(Pass):
    name = "elementwise-fusion"
    changes = ("replaces each chain of two or more elementwise ops (those whose definition "
               "gives chain_operands: Add or two-input Sum, Sub, Mul, Div, Relu, Sigmoid, Tanh, "
               "Erf, Exp, Neg, Abs, Sqrt, HardSigmoid, HardSwish, LeakyRelu, Clip with constant "
               "bounds, Pow with a constant exponent) whose intermediate results have one reader "
               "and the chain's shape (with the producers of its inputs that only the chain "
               "reads), and each lone op of ``alone`` (a float32 Mul among them), with one "
               "FusedElementwise node")
    # ops worth a FusedElementwise node of their own, for these dtypes: their reference kernels
    # make several passes over memory and temporaries (np.clip, np.where), one generated loop
    # makes one (Sigmoid: float32 only, whose exp the fused kernels vectorize; libm's float64
    # exp per element loses to numpy's). A float32 Mul (a squeeze-and-excitation scale, the
    # channels' weights broadcast over the planes) for its planned buffer, where numpy's makes
    # a new array at each run: EfficientNet-B0 1.21x -> 1.14x onnxruntime. (A lone Add, as in
    # BERT's embeddings on 2x5x32 values, lost: 0.83x -> 0.87x; it stays an Add.)
    alone: dict[str, tuple[DType, ...]] = {"HardSwish": _FLOATS, "HardSigmoid": _FLOATS,
                                           "LeakyRelu": _FLOATS, "Sigmoid": (DType.F32,),
                                           "Clip": _FLOATS, "Mul": (DType.F32,)}

    def run(self, graph: Graph) -> PassResult:
        uses = Uses(graph)
        specs = None
        taken: set[int] = set()
        fused = 0
        for node in list(graph.nodes):
            if id(node) in taken or chain_operands(_op(node)) is None:
                continue
            if specs is None:
                specs = graph.validate(allow_unknown=True)
            if not self._fusable(graph, node, specs):
                continue
            final = specs[node.outputs[0]]
            chain = [node]
            while True:
                nxt = uses.sole_consumer(chain[-1].outputs[0])
                if nxt is None or id(nxt) in taken or chain_operands(_op(nxt)) is None:
                    break
                if not self._fusable(graph, nxt, specs):
                    break
                if tuple(specs[nxt.outputs[0]].shape) != tuple(final.shape) and len(chain) > 1:
                    break
                chain.append(nxt)
                final = specs[nxt.outputs[0]]
            if any(tuple(specs[n.outputs[0]].shape) != tuple(final.shape) for n in chain[1:]):
                continue
            self._absorb(graph, chain, uses, taken, specs, final)
            if len(chain) < 2 and final.dtype not in self.alone.get(_op(node), ()):
                continue
            candidate = self._build(graph, chain)
            if candidate is None or not same_spec(candidate, specs, [final]):
                continue
            for n in chain:
                taken.add(id(n))
            at = graph.nodes.index(chain[-1])
            graph.nodes[at] = candidate
            for n in chain[:-1]:
                graph.nodes.remove(n)
            uses.producer[candidate.outputs[0]] = candidate
            fused += 1
        return PassResult(fused)

    def _absorb(self, graph: Graph, chain: list[Node], uses: Uses, taken: set[int], specs,
                final) -> None:
        """Prepend to ``chain`` the producers of its inputs that only the chain reads (so the
        chain is a DAG over one value read twice, as in x * (1 + erf(x / c)) after a bias Add),
        when they are fusable and of the chain's shape (a smaller value is not recomputed per
        output element)."""
        grown = True
        while grown:
            grown = False
            inside = {id(n) for n in chain}
            made = {n.outputs[0] for n in chain}
            for n in list(chain):
                for name in n.inputs[:chain_operands(_op(n))]:
                    if name in made or name in uses.outputs:
                        continue
                    p = uses.producer.get(name)
                    if p is None or id(p) in taken or id(p) in inside or \
                            chain_operands(_op(p)) is None or any(i in made for i in p.inputs):
                        continue
                    readers = uses.readers.get(name, ())
                    if not readers or any(id(r) not in inside for r in readers):
                        continue
                    if tuple(specs[name].shape) != tuple(final.shape) or \
                            not self._fusable(graph, p, specs):
                        continue
                    chain.insert(0, p)
                    grown = True
                    break
                if grown:
                    break

    @staticmethod
    def _fusable(graph: Graph, n: Node, specs) -> bool:
        if len(n.outputs) != 1 or not n.outputs[0]:
            return False
        out = specs.get(n.outputs[0])
        if out is None or out.dtype not in _FLOATS:
            return False
        op = _op(n)
        arity = chain_operands(op)
        opdef = OPS[op]
        consts = opdef.inputs[arity:]  # literals of the program: constant scalars only
        if not arity <= len(n.inputs) <= arity + len(consts):
            return False
        for k, name in enumerate(consts):
            given = n.inputs[arity + k] if arity + k < len(n.inputs) else ""
            value = graph.initializers.get(given) if given else None
            if (not given and name not in opdef.optional) or (
                    given and (value is None or np.size(value) != 1)):
                return False
            if given and np.asarray(value).dtype.kind == "f" and np.isnan(value).any():
                return False  # a program writes an omitted bound as nan: a NaN one is not that
        for attr, default in opdef.attrs.items():
            value = n.attrs.get(attr, default)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                return False
        return all(specs.get(i) is not None and specs[i].dtype == out.dtype
                   for i in n.inputs[:arity])

    @staticmethod
    def _build(graph: Graph, chain: list[Node]) -> Node | None:
        refs: dict[str, str] = {}
        inputs: list[str] = []
        program: list[str] = []
        for k, n in enumerate(chain):
            op = _op(n)
            arity = chain_operands(op)
            opdef = OPS[op]
            args = []
            for name in n.inputs[:arity]:
                if name not in refs:
                    refs[name] = f"x{len(inputs)}"
                    inputs.append(name)
                args.append(refs[name])
            for i in range(arity, len(opdef.inputs)):
                given = n.inputs[i] if i < len(n.inputs) else ""
                args.append(repr(float(np.asarray(graph.initializers[given]).reshape(-1)[0]))
                            if given else "nan")
            args += [repr(float(n.attrs.get(a, d))) for a, d in opdef.attrs.items()]
            program.append(" ".join([op, *args]))
            refs[n.outputs[0]] = f"t{k}"
        last = chain[-1]
        return Node("FusedElementwise", inputs, [last.outputs[0]], {"program": program},
                    last.name)
