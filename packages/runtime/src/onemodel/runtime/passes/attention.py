"""Attention written out node by node, made one FusedAttention node."""

from __future__ import annotations

from ..graph import Graph, Node
from .base import Pass, PassResult, Uses, same_spec
from .rewrites import _scalar


class AttentionFusion(Pass):
    name = "attention-fusion"
    changes = ("replaces MatMul(Q, Kt), an optional Mul or Div by a constant scalar, an optional "
               "Add of a mask, Softmax over the last axis and MatMul by V (attention as "
               "torch.onnx exports BERT, GPT-2, ViT, Whisper and LLaMA) with one FusedAttention "
               "node reading Q, Kt, V and the mask")

    # Why: four to five kernel calls per head group on small models (about 2-5 us apiece)
    # and three passes over the scores; one kernel computes each query row's scores, softmax
    # and weighted sum of V while the row stays in registers and cache.
    def run(self, graph: Graph) -> PassResult:
        uses = Uses(graph)
        specs = None
        done = 0
        for soft in list(graph.nodes):
            if soft.op != "Softmax":
                continue
            found = self._match(graph, uses, soft)
            if found is None:
                continue
            qk, scale, mask, pv, chain = found
            if specs is None:
                specs = graph.validate(allow_unknown=True)
            x = specs.get(soft.inputs[0])
            if x is None or not x.dtype.is_floating or len(x.shape) < 2:
                continue
            axis = soft.attrs.get("axis", -1)
            if axis % len(x.shape) != len(x.shape) - 1:
                continue
            inputs = [qk.inputs[0], qk.inputs[1], pv.inputs[1]] + ([mask] if mask else [])
            fused = Node("FusedAttention", inputs, list(pv.outputs), {"scale": scale},
                         soft.name or pv.name)
            if not same_spec(fused, specs, [specs.get(pv.outputs[0])]):
                continue
            graph.nodes[graph.nodes.index(pv)] = fused
            uses.producer[pv.outputs[0]] = fused
            for n in chain:
                graph.nodes.remove(n)
            done += 1
        return PassResult(done)

    @staticmethod
    def _match(graph: Graph, uses: Uses, soft: Node):
        """(Q@Kt node, scale, mask or "", P@V node, nodes to drop) around ``soft``."""
        pv = uses.sole_consumer(soft.outputs[0])
        if pv is None or pv.op != "MatMul" or pv.inputs[0] != soft.outputs[0] or \
                pv.inputs[1] == soft.outputs[0]:
            return None
        value = soft.inputs[0]
        node = uses.producer.get(value)
        if node is not None and node.op == "Add" and uses.sole_consumer(value) is soft and \
                node.inputs[0] != node.inputs[1]:
            for side in (0, 1):  # the scores: the side a MatMul (maybe scaled) produced
                found = _scores(graph, uses, node.inputs[side], node)
                if found is not None:
                    qk, scale, nodes = found
                    return qk, scale, node.inputs[1 - side], pv, [soft, node, *nodes]
            return None
        found = _scores(graph, uses, value, soft)
        if found is None:
            return None
        qk, scale, nodes = found
        return qk, scale, "", pv, [soft, *nodes]


def _scores(graph: Graph, uses: Uses, value: str, reader: Node):
    """(Q@Kt node, scale, its nodes) when ``value``, read only by ``reader``, is MatMul(Q, Kt)
    or that product times (or divided by) a constant scalar; else None."""
    if uses.sole_consumer(value) is not reader:
        return None
    node = uses.producer.get(value)
    if node is None:
        return None
    if node.op == "MatMul":
        return node, 1.0, [node]
    if node.op not in ("Mul", "Div"):
        return None
    for side in ((0,) if node.op == "Div" else (0, 1)):
        product, const = node.inputs[side], node.inputs[1 - side]
        c = _scalar(graph, const)
        qk = uses.producer.get(product)
        if c is None or c == 0.0 or qk is None or qk.op != "MatMul" or \
                uses.sole_consumer(product) is not node:
            continue
        return qk, (c if node.op == "Mul" else 1.0 / c), [node, qk]
    return None
