"""Attention written out node by node, made one FusedAttention node."""

from __future__ import annotations

from onemodel.tensors import OneModelError
from onemodel.tensors.ops import OPS

from ..graph import Graph, Node
from .base import Pass, PassResult, Uses, same_spec
from .rewrites import _scalar


class AttentionFusion(Pass):
    name = "attention-fusion"
    changes = ("replaces MatMul(Q, Kt), an optional Mul or Div by a constant scalar, optional "
               "Adds of masks, Softmax over the last axis and MatMul by V (attention as "
               "torch.onnx exports BERT, GPT-2, ViT, Whisper and LLaMA; T5's decoder adds its "
               "position bias, then its causal mask) with one FusedAttention node reading Q, "
               "Kt, V and the mask (several masks added together first); a Transpose "
               "(0, 2, 1, 3) after it, which gathers the heads back, becomes the node's "
               "transpose_output")

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
            qk, scale, masks, pv, chain = found
            if specs is None:
                specs = graph.validate(allow_unknown=True)
            x = specs.get(soft.inputs[0])
            if x is None or not x.dtype.is_floating or len(x.shape) < 2:
                continue
            axis = soft.attrs.get("axis", -1)
            if axis % len(x.shape) != len(x.shape) - 1:
                continue
            # several masks (T5's position bias, then its causal mask): added together first,
            # in the order the scores met them; (s + a) + b and s + (a + b) differ by rounding
            summed = _summed_masks(graph, specs, masks, soft.name or pv.name)
            if summed is None:
                continue
            mask, mask_adds = summed
            inputs = [qk.inputs[0], qk.inputs[1], pv.inputs[1]] + ([mask] if mask else [])
            # the Transpose that gathers the heads back ((B, H, S, D) -> (B, S, H, D)): the
            # fused node writes that layout itself, so the Reshape after it is a view
            after = uses.sole_consumer(pv.outputs[0])
            gathered = after is not None and after.op == "Transpose" and \
                list(after.attrs.get("perm", ())) == [0, 2, 1, 3] and \
                len(getattr(specs.get(pv.outputs[0]), "shape", ())) == 4
            attrs = {"scale": scale, **({"transpose_output": 1} if gathered else {})}
            end = after if gathered else pv
            fused = Node("FusedAttention", inputs, list(end.outputs), attrs,
                         soft.name or pv.name)
            if not same_spec(fused, specs, [specs.get(end.outputs[0])]):
                continue
            at = graph.nodes.index(end)
            graph.nodes[at:at + 1] = [*mask_adds, fused]
            uses.producer[end.outputs[0]] = fused
            for n in (*chain, *([pv] if gathered else [])):
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
        value, reader = soft.inputs[0], soft
        masks: list[str] = []  # outermost first
        adds: list[Node] = []
        while len(adds) < _MAX_MASKS:
            node = uses.producer.get(value)
            if node is None or node.op != "Add" or uses.sole_consumer(value) is not reader or \
                    node.inputs[0] == node.inputs[1]:
                break
            for side in (0, 1):  # the scores: the side a MatMul (maybe scaled) produced
                found = _scores(graph, uses, node.inputs[side], node)
                if found is not None:
                    qk, scale, nodes = found
                    return (qk, scale, [node.inputs[1 - side], *masks][::-1], pv,
                            [soft, *adds, node, *nodes])
            # else the scores lie further down the one side that is an Add read only here
            down = [side for side in (0, 1) if getattr(uses.producer.get(node.inputs[side]),
                                                       "op", None) == "Add"]
            if len(down) != 1:
                return None
            masks.append(node.inputs[1 - down[0]])
            adds.append(node)
            value, reader = node.inputs[down[0]], node
        if adds:
            return None
        found = _scores(graph, uses, value, soft)
        if found is None:
            return None
        qk, scale, nodes = found
        return qk, scale, [], pv, [soft, *nodes]


# masks added to the scores one after another that the fused node takes (summed)
_MAX_MASKS = 4


def _summed_masks(graph: Graph, specs: dict, masks: list[str], name: str):
    """(the one mask value or "", the Add nodes that make it) for ``masks`` in the order the
    scores met them; None when a mask's spec is unknown or they do not broadcast."""
    if len(masks) <= 1:
        return (masks[0] if masks else ""), []
    adds, total = [], masks[0]
    for k, m in enumerate(masks[1:]):
        a, b = specs.get(total), specs.get(m)
        if a is None or b is None:
            return None
        out = graph.fresh_name(f"{name}_mask_sum{k}")
        node = Node("Add", [total, m], [out], {}, f"{name}/mask_sum{k}")
        try:
            specs[out] = OPS["Add"].infer([a, b], {})[0]
        except OneModelError:
            return None
        adds.append(node)
        total = out
    return total, adds


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
