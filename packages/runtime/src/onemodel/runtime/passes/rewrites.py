"""Rewrites that make fewer, bigger kernels: BatchNorm folded into Conv or Gemm, MatMul+Add to
Gemm, and an activation fused into the Conv or Gemm before it."""

from __future__ import annotations

import numpy as np

from onemodel.tensors.ops.fused import ACTIVATIONS

from ..graph import Graph, Node
from .base import Pass, sole_consumer


def _init(graph: Graph, name: str):
    return graph.initializers.get(name) if name else None


class BatchNormFolding(Pass):
    name = "batchnorm-folding"
    changes = ("folds an inference BatchNormalization into the Conv or Gemm that feeds it "
               "(constant weights): scales the weights, shifts the bias, drops the BN node")

    def run(self, graph: Graph) -> bool:
        for bn in graph.nodes:
            if bn.op != "BatchNormalization":
                continue
            params = [_init(graph, i) for i in bn.inputs[1:5]]
            if any(p is None for p in params):
                continue
            producer = next((n for n in graph.nodes if bn.inputs[0] in n.outputs), None)
            if producer is None or producer.op not in ("Conv", "Gemm"):
                continue
            if sole_consumer(graph, bn.inputs[0]) is not bn:
                continue
            w = _init(graph, producer.inputs[1])
            if w is None:
                continue
            b_name = producer.inputs[2] if len(producer.inputs) > 2 else ""
            b = _init(graph, b_name) if b_name else None
            if b_name and b is None:
                continue
            scale, shift, mean, var = (p.astype(np.float64) for p in params)
            factor = scale / np.sqrt(var + bn.attrs.get("epsilon", 1e-5))
            if producer.op == "Conv":
                w_new = w * factor.reshape(-1, *([1] * (w.ndim - 1)))
            else:
                if producer.attrs.get("transA", 0) or producer.attrs.get("beta", 1.0) != 1.0:
                    continue
                if producer.attrs.get("alpha", 1.0) != 1.0:
                    continue
                w_new = w * factor if not producer.attrs.get("transB", 0) else w * factor[:, None]
            bias = (np.zeros(len(factor)) if b is None else
                    b.reshape(-1) if b.size == len(factor) else np.broadcast_to(b, factor.shape))
            b_new = (bias - mean) * factor + shift
            w_name = graph.fresh_name(producer.inputs[1] + "_bnfold")
            graph.initializers[w_name] = w_new.astype(w.dtype)
            new_b = graph.fresh_name((b_name or "bias") + "_bnfold")
            graph.initializers[new_b] = b_new.astype(w.dtype)
            producer.inputs = [producer.inputs[0], w_name, new_b]
            producer.outputs = [bn.outputs[0]]
            graph.nodes.remove(bn)
            return True
        return False


class MatMulAddToGemm(Pass):
    name = "matmul-add-to-gemm"
    changes = "replaces MatMul(A, B) followed by Add(bias) with Gemm(A, B, bias) for 2-D A and B"

    def run(self, graph: Graph) -> bool:
        specs = None
        for mm in graph.nodes:
            if mm.op != "MatMul":
                continue
            add = sole_consumer(graph, mm.outputs[0])
            if add is None or add.op != "Add":
                continue
            if specs is None:
                specs = graph.validate(allow_unknown=True)
            a, b = (specs[i] for i in mm.inputs)
            if a is None or b is None or specs[add.inputs[0]] is None or \
                    specs[add.inputs[1]] is None:
                continue
            if len(a.shape) != 2 or len(b.shape) != 2:
                continue
            other = add.inputs[1] if add.inputs[0] == mm.outputs[0] else add.inputs[0]
            c = specs[other]
            n_out = b.shape[1]
            if len(c.shape) > 2 or (c.shape and not (c.shape[-1] == n_out or c.shape[-1] == 1)):
                continue
            if len(c.shape) == 2 and c.shape[0] != 1:
                continue
            mm.op = "Gemm"
            mm.inputs = [mm.inputs[0], mm.inputs[1], other]
            mm.outputs = [add.outputs[0]]
            mm.attrs = {}
            graph.nodes.remove(add)
            return True
        return False


class ActivationFusion(Pass):
    name = "activation-fusion"
    changes = ("fuses Relu, Sigmoid or Tanh into the Conv or Gemm before it "
               "(FusedConv, FusedGemm)")

    def run(self, graph: Graph) -> bool:
        for node in graph.nodes:
            if node.op not in ("Conv", "Gemm"):
                continue
            act = sole_consumer(graph, node.outputs[0])
            if act is None or act.op not in ACTIVATIONS:
                continue
            fused = Node("Fused" + node.op, list(node.inputs), list(act.outputs),
                         {**node.attrs, "activation": act.op}, node.name)
            at = graph.nodes.index(node)
            graph.nodes[at] = fused
            graph.nodes.remove(act)
            return True
        return False
