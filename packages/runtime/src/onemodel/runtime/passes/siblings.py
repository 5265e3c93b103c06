"""Products of one input by several constant weights made one product."""

from __future__ import annotations

import numpy as np

from onemodel.tensors import OneModelError
from onemodel.tensors.ops import OPS

from ..graph import Graph, Node
from .base import Pass, PassResult, Uses, frozen, same_spec, spec_of_array

# merged weights at most this large: the merged copy is new memory while the session keeps its
# source graph, and where weights are larger the products' arithmetic, not the calls, dominates
MERGE_MAX_BYTES = 4 << 20


class SiblingMatMulMerge(Pass):
    name = "sibling-matmul-merge"
    changes = ("MatMuls of one input by constant 2-D weights with as many rows (a transformer's "
               "Q, K and V projections, LLaMA's gate and up projections) become one MatMul by "
               "the weights side by side; when any is followed by an Add of a constant bias, "
               "those become one Add too (zeros for the columns of a product without one, as "
               "Whisper's K); a Split along the last axis hands each consumer its columns "
               "(merged weights up to 4 MiB)")

    # Why: on small models each product is a kernel call of about 2 us whatever its size, and
    # each bias Add another 1-1.5 us; one product three times as wide costs little more than
    # one. The Split's parts are views, so nothing is copied. A product without a bias gets
    # zeros: adding 0 changes no value but the sign of a zero (-0.0 + 0.0 is 0.0), and the one
    # Add (or the fused product's bias) replaces the others' steps.
    def run(self, graph: Graph) -> PassResult:
        uses = Uses(graph)
        groups: dict[tuple, list[Node]] = {}
        for n in graph.nodes:
            if n.op != "MatMul" or len(n.inputs) != 2:
                continue
            w = graph.initializers.get(n.inputs[1])
            if w is None or w.ndim != 2 or w.dtype.kind != "f" or w.shape[1] == 0 or \
                    n.outputs[0] in uses.outputs:
                continue
            groups.setdefault((n.inputs[0], w.shape[0], w.dtype.str), []).append(n)
        specs = None
        done = 0
        for members in groups.values():
            if len(members) < 2:
                continue
            if specs is None:
                specs = graph.validate(allow_unknown=True)
            if self._merge(graph, uses, specs, members):
                done += 1
        return PassResult(done)

    @staticmethod
    def _merge(graph: Graph, uses: Uses, specs: dict, members: list[Node]) -> bool:
        x = members[0].inputs[0]
        xs = specs.get(x)
        if xs is None or len(xs.shape) < 2 or not xs.dtype.is_floating:
            return False
        weights = [graph.initializers[n.inputs[1]] for n in members]
        if sum(w.nbytes for w in weights) > MERGE_MAX_BYTES:
            return False
        adds = [_bias_add(graph, uses, n) for n in members]
        biased = [a for a in adds if a is not None]
        with_bias = bool(biased)
        # the nodes whose values go on: each bias Add, or the product that has none
        ends = [n if a is None else a[0] for n, a in zip(members, adds)]
        wanted = [specs.get(n.outputs[0]) for n in ends]
        if any(s is None for s in wanted) or any(n.outputs[0] in uses.outputs for n in ends):
            return False
        w_name = graph.fresh_name(members[0].inputs[1] + "_merged")
        product = graph.fresh_name(members[0].outputs[0] + "_merged")
        sizes = graph.fresh_name(members[0].name + "_merged_sizes")
        new = [Node("MatMul", [x, w_name], [product], {}, members[0].name + "_merged")]
        split_input = product
        if with_bias:
            first_add, first_bias = biased[0]
            b_name = graph.fresh_name(first_bias + "_merged")
            split_input = graph.fresh_name(first_add.outputs[0] + "_merged")
            new.append(Node("Add", [product, b_name], [split_input], {},
                            first_add.name + "_merged"))
        new.append(Node("Split", [split_input, sizes], [n.outputs[0] for n in ends],
                        {"axis": -1}, members[0].name + "_split"))
        # frozen: the session's own copies, which kernels may lay out once (base.frozen)
        arrays = {w_name: frozen(np.concatenate(weights, axis=1)),
                  sizes: np.array([w.shape[1] for w in weights], np.int64)}
        if with_bias:
            arrays[b_name] = frozen(np.concatenate([
                np.zeros(w.shape[1], w.dtype) if a is None else graph.initializers[a[1]]
                for w, a in zip(weights, adds)]))
        trial = dict(specs)
        trial.update({name: spec_of_array(arr) for name, arr in arrays.items()})
        try:  # the product (and the Add): their shape rules accept them
            for node in new[:-1]:
                trial[node.outputs[0]] = OPS[node.op].infer([trial[i] for i in node.inputs],
                                                            node.attrs)[0]
        except OneModelError:
            return False
        if not same_spec(new[-1], trial, wanted):
            return False
        graph.initializers.update(arrays)
        at = min(graph.nodes.index(n) for n in members)
        gone = set(map(id, members)) | {id(a) for a, _ in biased}
        kept = [n for n in graph.nodes[:at] if id(n) not in gone]
        rest = [n for n in graph.nodes[at:] if id(n) not in gone]
        graph.nodes[:] = kept + new + rest
        for node in new:
            for o in node.outputs:
                uses.producer[o] = node
        return True


def _bias_add(graph: Graph, uses: Uses, matmul: Node):
    """(the Add node, the bias's name) when the product's only reader adds a constant 1-D bias
    of its width, else None."""
    add = uses.sole_consumer(matmul.outputs[0])
    if add is None or add.op != "Add" or len(add.inputs) != 2:
        return None
    other = add.inputs[1] if add.inputs[0] == matmul.outputs[0] else add.inputs[0]
    if other == matmul.outputs[0]:
        return None
    b = graph.initializers.get(other)
    w = graph.initializers[matmul.inputs[1]]
    if b is None or b.ndim != 1 or b.shape[0] != w.shape[1] or b.dtype != w.dtype:
        return None
    return add, other
