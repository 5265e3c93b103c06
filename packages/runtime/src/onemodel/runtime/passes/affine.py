"""Per-channel scales and shifts folded away: into the convolution or the Linear layer before
them, or an inference BatchNormalization made the Mul and Add it is, for the elementwise chain
after it to take."""

from __future__ import annotations

import numpy as np

from ..graph import Graph, Node
from .base import Pass, PassResult, Uses, frozen, same_spec, spec_of_array


def _per_channel(value: np.ndarray | None, channels: int, rank: int) -> np.ndarray | None:
    """``value`` as a (channels,) vector when, broadcast against an NC... tensor of ``rank``
    axes, it holds one number per channel (shape (C, 1, ..), (1, C, 1, ..), or one element);
    else None. It must not add axes or broadcast the tensor up."""
    if value is None or value.dtype.kind != "f" or value.ndim > rank:
        return None
    if value.size == 1:
        return np.full(channels, value.reshape(-1)[0], value.dtype)
    shape = (1,) * (rank - value.ndim) + value.shape
    if shape[1] != channels or any(d != 1 for i, d in enumerate(shape) if i != 1):
        return None
    return value.reshape(channels)


def _const_operand(graph: Graph, node: Node, value: str) -> str | None:
    """The other input of a binary ``node`` reading ``value``, when it is an initializer."""
    if len(node.inputs) != 2 or node.inputs[0] == node.inputs[1]:
        return None
    other = node.inputs[1] if node.inputs[0] == value else node.inputs[0]
    return other if other in graph.initializers else None


class ConvAffineFolding(Pass):
    name = "conv-affine-folding"
    changes = ("folds a Mul or Add by a per-output-channel constant after a Conv with constant "
               "weights (Caffe's Scale layer after its BatchNorm, in Inception v2 and "
               "DenseNet exports) into the Conv's weights and bias")

    # Why: each is a pass over the convolution's output, 45 us apiece on DenseNet-121's maps;
    # folded, the Relu after them joins the convolution (activation-fusion).
    def run(self, graph: Graph) -> PassResult:
        uses = Uses(graph)
        specs = None
        done = 0
        for conv in list(graph.nodes):
            if conv.op != "Conv" or len(conv.inputs) < 2:
                continue
            while True:  # a scale then a shift: both, before elementwise fusion takes the rest
                folded, specs = self._fold_next(graph, uses, conv, specs)
                if not folded:
                    break
                done += 1
        return PassResult(done)

    @staticmethod
    def _fold_next(graph: Graph, uses: Uses, conv: Node, specs):
        """Fold the Mul or Add that alone reads ``conv``'s output into it; (whether one was
        folded, the value specs)."""
        w = graph.initializers.get(conv.inputs[1])
        b_name = conv.inputs[2] if len(conv.inputs) > 2 else ""
        b = graph.initializers.get(b_name) if b_name else None
        if w is None or w.dtype.kind != "f" or (b_name and b is None):
            return False, specs
        step = uses.sole_consumer(conv.outputs[0])
        if step is None or step.op not in ("Mul", "Add"):
            return False, specs
        other = _const_operand(graph, step, conv.outputs[0])
        k = _per_channel(graph.initializers.get(other) if other else None, w.shape[0], w.ndim)
        if k is None or k.dtype != w.dtype:
            return False, specs
        bias = np.zeros(w.shape[0], w.dtype) if b is None else b
        if step.op == "Mul":
            w_new = frozen((w * k.reshape(-1, *([1] * (w.ndim - 1)))).astype(w.dtype))
            b_new = frozen((bias * k).astype(w.dtype))
        else:
            w_new, b_new = w, frozen((bias + k).astype(w.dtype))
        if specs is None:
            specs = graph.validate(allow_unknown=True)
        w_name = conv.inputs[1] if w_new is w else graph.fresh_name(conv.inputs[1] + "_aff")
        new_b = graph.fresh_name((b_name or conv.name or "conv") + "_bias_aff")
        specs[w_name], specs[new_b] = spec_of_array(w_new), spec_of_array(b_new)
        candidate = Node("Conv", [conv.inputs[0], w_name, new_b], [step.outputs[0]],
                         dict(conv.attrs), conv.name)
        if not same_spec(candidate, specs, [specs.get(step.outputs[0])]):
            return False, specs
        graph.initializers[w_name] = w_new
        graph.initializers[new_b] = b_new
        conv.inputs, conv.outputs = candidate.inputs, candidate.outputs
        uses.producer[step.outputs[0]] = conv
        graph.nodes.remove(step)
        return True, specs


class MatMulScaleFolding(Pass):
    name = "matmul-scale-folding"
    changes = ("folds a Mul by a constant row of scales (one per column) that alone reads a "
               "MatMul's output by constant 2-D weights, or the Add of a constant bias row "
               "after it, or a FusedMatMul's without an activation (a ConvNeXt block's layer "
               "scale after its second Linear, Whisper's query scale after its bias), into "
               "the weights' columns and the bias")

    # Why: the scale is a pass over the product and a step of its own (1.7-2.2 us on the
    # transformers ConvNeXt's 2x8x8x8); folded, the weights carry it, as a Conv's carry a
    # BatchNorm's. Before sibling-matmul-merge (order 52): a query scaled after its bias
    # (Whisper's) is then a plain projection, merged with K and V into one product.
    # (x @ W + b) * g and x @ (W * g) + b * g differ by the rounding of each term
    def run(self, graph: Graph) -> PassResult:
        uses = Uses(graph)
        specs = None
        done = 0
        for node in list(graph.nodes):
            if node.op not in ("MatMul", "FusedMatMul") or len(node.inputs) < 2 or \
                    node.attrs.get("activation", ""):
                continue
            w = graph.initializers.get(node.inputs[1])
            b_name = node.inputs[2] if len(node.inputs) > 2 else ""
            b = graph.initializers.get(b_name) if b_name else None
            if w is None or w.ndim != 2 or w.dtype.kind != "f" or (b_name and b is None):
                continue
            n = w.shape[1]
            step = uses.sole_consumer(node.outputs[0])
            add = None  # a MatMul's bias Add between the product and the scale
            if step is not None and step.op == "Add" and node.op == "MatMul":
                bias = _const_operand(graph, step, node.outputs[0])
                b = graph.initializers.get(bias) if bias else None
                if b is None or b.dtype != w.dtype or b.shape != (n,):
                    continue
                add, b_name, step = step, bias, uses.sole_consumer(step.outputs[0])
            if step is None or step.op != "Mul":
                continue
            scaled = (add or node).outputs[0]
            other = _const_operand(graph, step, scaled)
            g = graph.initializers.get(other) if other else None
            if g is None or g.dtype != w.dtype or g.size not in (1, n) or \
                    (g.size == n and g.shape[-1] != n) or any(d != 1 for d in g.shape[:-1]):
                continue
            if specs is None:
                specs = graph.validate(allow_unknown=True)
            out = specs.get(scaled)
            if out is None or len(g.shape) > len(out.shape):  # a Mul that adds axes
                continue
            row = np.broadcast_to(g.reshape(-1), (n,))
            w_new = frozen((w * row).astype(w.dtype))
            w_name = graph.fresh_name(node.inputs[1] + "_scaled")
            inputs = [node.inputs[0], w_name]
            specs[w_name] = spec_of_array(w_new)
            if b is not None:
                b_new = frozen((b * row).astype(w.dtype))
                b_scaled = graph.fresh_name(b_name + "_scaled")
                specs[b_scaled] = spec_of_array(b_new)
            if add is None:
                inputs += [b_scaled] if b is not None else []
                candidate = Node(node.op, inputs, [step.outputs[0]], dict(node.attrs),
                                 node.name)
                if not same_spec(candidate, specs, [specs.get(step.outputs[0])]):
                    continue
            else:  # the product, then its Add, which now writes the Mul's value
                product = Node(node.op, inputs, list(node.outputs), dict(node.attrs), node.name)
                a, c = (node.outputs[0], b_scaled) if add.inputs[0] == node.outputs[0] else \
                    (b_scaled, node.outputs[0])
                candidate = Node("Add", [a, c], [step.outputs[0]], dict(add.attrs), add.name)
                if not same_spec(product, specs, [specs.get(node.outputs[0])]) or \
                        not same_spec(candidate, specs, [specs.get(step.outputs[0])]):
                    continue
            graph.initializers[w_name] = w_new
            if b is not None:
                graph.initializers[b_scaled] = b_new
            if add is None:
                node.inputs, node.outputs = candidate.inputs, candidate.outputs
                uses.producer[step.outputs[0]] = node
            else:
                node.inputs = product.inputs
                add.inputs, add.outputs = candidate.inputs, candidate.outputs
                uses.producer[step.outputs[0]] = add
            graph.nodes.remove(step)
            done += 1
        return PassResult(done)


class BatchNormToAffine(Pass):
    name = "batchnorm-to-affine"
    changes = ("replaces an inference BatchNormalization with constant parameters that no "
               "Conv or Gemm absorbed (DenseNet's after a Concat) with the Mul and Add by "
               "per-channel constants it computes, so the elementwise chain after it fuses "
               "with it")

    # Why: DenseNet-121 runs 62 such BatchNorms, each followed by a scale, a shift and a Relu:
    # one pass over the maps instead of two once the chain is one node.
    def run(self, graph: Graph) -> PassResult:
        uses = Uses(graph)
        specs = None
        done = 0
        for bn in list(graph.nodes):
            if bn.op != "BatchNormalization" or len([o for o in bn.outputs if o]) != 1 or \
                    bn.attrs.get("training_mode", 0) or not bn.outputs[0]:
                continue
            params = [graph.initializers.get(i) for i in bn.inputs[1:5]]
            if len(params) != 4 or any(p is None or p.ndim != 1 for p in params):
                continue
            producer = uses.producer.get(bn.inputs[0])
            if producer is not None and producer.op in ("Conv", "Gemm"):
                continue  # batchnorm-folding's to take
            if specs is None:
                specs = graph.validate(allow_unknown=True)
            xs = specs.get(bn.inputs[0])
            if xs is None or len(xs.shape) < 2 or not xs.dtype.is_floating or \
                    any(p.dtype != xs.dtype.numpy for p in params):
                continue
            scale, shift, mean, var = (p.astype(np.float64) for p in params)
            factor = scale / np.sqrt(var + bn.attrs.get("epsilon", 1e-5))
            tail = (1,) * (len(xs.shape) - 2)
            a = factor.astype(xs.dtype.numpy).reshape(-1, *tail)
            c = (shift - mean * factor).astype(xs.dtype.numpy).reshape(-1, *tail)
            a_name = graph.fresh_name(bn.inputs[1] + "_affine_scale")
            c_name = graph.fresh_name(bn.inputs[2] + "_affine_shift")
            scaled = graph.fresh_name(bn.outputs[0] + "_scaled")
            mul = Node("Mul", [bn.inputs[0], a_name], [scaled], {}, bn.name + "_scale")
            add = Node("Add", [scaled, c_name], [bn.outputs[0]], {}, bn.name + "_shift")
            trial = dict(specs)
            trial[a_name], trial[c_name] = spec_of_array(a), spec_of_array(c)
            if not same_spec(mul, trial, [None]):
                continue
            trial[scaled] = trial[bn.inputs[0]]
            if not same_spec(add, trial, [specs.get(bn.outputs[0])]):
                continue
            graph.initializers[a_name], graph.initializers[c_name] = a, c
            at = graph.nodes.index(bn)
            graph.nodes[at:at + 1] = [mul, add]
            uses.producer[scaled], uses.producer[bn.outputs[0]] = mul, add
            done += 1
        return PassResult(done)
