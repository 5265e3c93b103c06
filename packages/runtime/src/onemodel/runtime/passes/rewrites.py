"""Rewrites that make fewer, bigger kernels: BatchNorm folded into Conv or Gemm, MatMul+Add to
Gemm, an activation fused into the Conv or Gemm before it, a residual Add (and the activation
after it) fused into the Conv before it, a bias Add and activation (GELU too) into the MatMul
before them, RMS normalization written out
node by node made one RMSNormalization, and a residual Add with the LayerNormalization after it
made one SkipLayerNormalization."""

from __future__ import annotations

import math

import numpy as np

from onemodel.tensors.ops.fused import ACTIVATIONS

from ..graph import Graph, Node
from .base import Pass, PassResult, Uses, frozen, same_spec, spec_of_array


def _init(graph: Graph, name: str):
    return graph.initializers.get(name) if name else None


class BatchNormFolding(Pass):
    name = "batchnorm-folding"
    changes = ("folds an inference BatchNormalization into the Conv or Gemm that feeds it "
               "(constant weights): scales the weights, shifts the bias, drops the BN node")

    def run(self, graph: Graph) -> PassResult:
        uses = Uses(graph)
        specs = None
        folded = 0
        for bn in list(graph.nodes):
            if bn.op != "BatchNormalization" or len([o for o in bn.outputs if o]) != 1:
                continue
            params = [_init(graph, i) for i in bn.inputs[1:5]]
            if len(params) != 4 or any(p is None for p in params):
                continue
            producer = uses.producer.get(bn.inputs[0])
            if producer is None or producer.op not in ("Conv", "Gemm"):
                continue
            if uses.sole_consumer(bn.inputs[0]) is not bn:
                continue
            w = _init(graph, producer.inputs[1])
            if w is None or w.dtype.kind != "f":
                continue
            b_name = producer.inputs[2] if len(producer.inputs) > 2 else ""
            b = _init(graph, b_name) if b_name else None
            if b_name and b is None:
                continue
            scale, shift, mean, var = (p.astype(np.float64) for p in params)
            factor = scale / np.sqrt(var + bn.attrs.get("epsilon", 1e-5))
            if producer.op == "Conv":
                if w.shape[0] != len(factor):
                    continue
                w_new = w * factor.reshape(-1, *([1] * (w.ndim - 1)))
            else:
                if producer.attrs.get("transA", 0) or producer.attrs.get("beta", 1.0) != 1.0:
                    continue
                if producer.attrs.get("alpha", 1.0) != 1.0:
                    continue
                if w.ndim != 2 or w.shape[0 if producer.attrs.get("transB", 0) else 1] != len(
                        factor):
                    continue  # mis-shaped BN parameters: validation names the node
                w_new = w * factor if not producer.attrs.get("transB", 0) else w * factor[:, None]
            if b is not None and b.size not in (1, len(factor)):
                continue
            bias = (np.zeros(len(factor)) if b is None else
                    b.reshape(-1) if b.size == len(factor) else np.broadcast_to(b, factor.shape))
            b_new = (bias - mean) * factor + shift
            if specs is None:
                specs = graph.validate(allow_unknown=True)
            w_name = graph.fresh_name(producer.inputs[1] + "_bnfold")
            new_b = graph.fresh_name((b_name or "bias") + "_bnfold")
            w_arr, b_arr = frozen(w_new.astype(w.dtype)), frozen(b_new.astype(w.dtype))
            specs[w_name], specs[new_b] = spec_of_array(w_arr), spec_of_array(b_arr)
            candidate = Node(producer.op, [producer.inputs[0], w_name, new_b], [bn.outputs[0]],
                             dict(producer.attrs), producer.name)
            if not same_spec(candidate, specs, [specs.get(bn.outputs[0])]):
                del specs[w_name], specs[new_b]
                continue
            graph.initializers[w_name] = w_arr
            graph.initializers[new_b] = b_arr
            producer.inputs = candidate.inputs
            producer.outputs = candidate.outputs
            uses.producer[bn.outputs[0]] = producer
            graph.nodes.remove(bn)
            folded += 1
        return PassResult(folded)


class MatMulAddToGemm(Pass):
    name = "matmul-add-to-gemm"
    changes = ("replaces MatMul(A, B) followed by Add(bias) with Gemm(A, B, bias) for 2-D "
               "floating-point A and B")

    def run(self, graph: Graph) -> PassResult:
        uses = Uses(graph)
        specs = None
        done = 0
        for mm in list(graph.nodes):
            if mm.op != "MatMul":
                continue
            add = uses.sole_consumer(mm.outputs[0])
            if add is None or add.op != "Add":
                continue
            if specs is None:
                specs = graph.validate(allow_unknown=True)
            a, b = (specs[i] for i in mm.inputs)
            if a is None or b is None or specs[add.inputs[0]] is None or \
                    specs[add.inputs[1]] is None:
                continue
            # Gemm is a floating-point op: integer MatMul + Add stays as it is
            if not (a.dtype.is_floating and b.dtype == a.dtype):
                continue
            if len(a.shape) != 2 or len(b.shape) != 2:
                continue
            other = add.inputs[1] if add.inputs[0] == mm.outputs[0] else add.inputs[0]
            c = specs[other]
            if c.dtype != a.dtype:
                continue
            n_out = b.shape[1]
            if len(c.shape) > 2 or (c.shape and not (c.shape[-1] == n_out or c.shape[-1] == 1)):
                continue
            if len(c.shape) == 2 and c.shape[0] != 1:
                continue
            candidate = Node("Gemm", [mm.inputs[0], mm.inputs[1], other], [add.outputs[0]], {},
                             mm.name)
            if not same_spec(candidate, specs, [specs[add.outputs[0]]]):
                continue
            mm.op, mm.inputs, mm.outputs, mm.attrs = ("Gemm", candidate.inputs,
                                                      candidate.outputs, {})
            uses.producer[add.outputs[0]] = mm
            graph.nodes.remove(add)
            done += 1
        return PassResult(done)


class ActivationFusion(Pass):
    name = "activation-fusion"
    changes = ("fuses Relu, Sigmoid, Tanh, HardSwish, Clip to constant bounds 0 and 6 "
               "(ReLU6, activation Relu6), or a Sigmoid and the Mul of the value by it (SiLU, "
               "activation Silu), into the Conv or Gemm before it (FusedConv, FusedGemm)")

    def run(self, graph: Graph) -> PassResult:
        uses = Uses(graph)
        specs = None
        done = 0
        for node in list(graph.nodes):
            if node.op not in ("Conv", "Gemm"):
                continue
            value = node.outputs[0]
            act = uses.sole_consumer(value)
            name = _activation(graph, act, value)
            gone = [act]
            if name is None:
                silu = _silu(uses, value)
                if silu is None:
                    continue
                name, act, gone = "Silu", silu[1], list(silu)
            if specs is None:
                specs = graph.validate(allow_unknown=True)
            fused = Node("Fused" + node.op, list(node.inputs), list(act.outputs),
                         {**node.attrs, "activation": name}, node.name)
            if not same_spec(fused, specs, [specs.get(act.outputs[0])]):
                continue
            at = graph.nodes.index(node)
            graph.nodes[at] = fused
            for o in fused.outputs:
                uses.producer[o] = fused
            for n in gone:
                graph.nodes.remove(n)
            done += 1
        return PassResult(done)


class ConvResidualFusion(Pass):
    name = "conv-residual-fusion"
    changes = ("replaces a Conv whose only reader is an Add of another value of the Conv's "
               "output shape and dtype (a residual connection), with the activation that alone "
               "reads the sum (as activation-fusion takes them), by one FusedConv(X, W, B, Z), "
               "Z the other addend")

    # Why: MobileNets, EfficientNet, MnasNet and ResNets end each residual block with a Conv,
    # an Add and often a Relu; fused, a kernel adds Z as it stores its output, where the Add
    # (and the Relu) were a step of their own, each a pass over the output
    def run(self, graph: Graph) -> PassResult:
        uses = Uses(graph)
        specs = None
        done = 0
        for node in list(graph.nodes):
            if node.op != "Conv" or len(node.outputs) != 1:
                continue
            value = node.outputs[0]
            add = uses.sole_consumer(value)
            if add is None or add.op not in ("Add", "Sum") or len(add.inputs) != 2 or \
                    add.inputs[0] == add.inputs[1]:
                continue
            z = add.inputs[1] if add.inputs[0] == value else add.inputs[0]
            if specs is None:
                specs = graph.validate(allow_unknown=True)
            y_spec, z_spec = specs.get(value), specs.get(z)
            if y_spec is None or z_spec is None or tuple(z_spec.shape) != tuple(y_spec.shape) \
                    or z_spec.dtype != y_spec.dtype:
                continue
            total = add.outputs[0]
            name, act_nodes = _epilogue_activation(graph, uses, total, gelu=False)
            final = act_nodes[-1].outputs[0] if act_nodes else total
            inputs = [*node.inputs, *[""] * (3 - len(node.inputs)), z]
            fused = Node("FusedConv", inputs, [final],
                         {**node.attrs, "activation": name or ""}, node.name)
            if not same_spec(fused, specs, [specs.get(final)]):
                continue
            _replace(graph, uses, node, [add, *act_nodes], fused)
            done += 1
        return PassResult(done)


class MatMulEpilogueFusion(Pass):
    name = "matmul-epilogue-fusion"
    changes = ("replaces a floating-point MatMul of A (two or more axes) by constant 2-D "
               "weights, the Add of a constant bias row of its columns that alone reads it, and "
               "the activation that alone reads the sum (one of FusedGemm's, or GELU written "
               "out with Erf as PyTorch exports it), by one FusedMatMul (a bias or an "
               "activation at least)")

    # Why: a transformer's Linear layers are MatMul + Add for 3-D activations (Gemm takes 2-D
    # ones), and its feed-forward GELU is five nodes; fused, a kernel adds the bias and
    # applies the activation as one pass over the product, where they were a step of their own
    def run(self, graph: Graph) -> PassResult:
        uses = Uses(graph)
        specs = None
        done = 0
        for mm in list(graph.nodes):
            if mm.op != "MatMul" or len(mm.inputs) != 2:
                continue
            w = _init(graph, mm.inputs[1])
            if w is None or w.ndim != 2 or w.dtype.kind != "f":
                continue
            value, bias, gone = mm.outputs[0], None, []
            add = uses.sole_consumer(value)
            other = _other(add, value) if add is not None and add.op == "Add" and \
                len(add.inputs) == 2 else None
            c = _init(graph, other) if other else None
            if c is not None and c.shape == (w.shape[1],) and c.dtype == w.dtype:
                bias, value, gone = other, add.outputs[0], [add]
            name, act_nodes = _epilogue_activation(graph, uses, value)
            if bias is None and name is None:
                continue
            final = act_nodes[-1].outputs[0] if act_nodes else value
            if specs is None:
                specs = graph.validate(allow_unknown=True)
            a = specs.get(mm.inputs[0])
            if a is None or len(a.shape) < 2 or not a.dtype.is_floating:
                continue
            fused = Node("FusedMatMul", [*mm.inputs, *([bias] if bias else [])], [final],
                         {"activation": name or ""}, mm.name)
            if not same_spec(fused, specs, [specs.get(final)]):
                continue
            _replace(graph, uses, mm, [*gone, *act_nodes], fused)
            done += 1
        return PassResult(done)


def _replace(graph: Graph, uses: Uses, first: Node, gone: list[Node], fused: Node) -> None:
    """``fused`` in place of ``first`` and the nodes ``gone`` after it (in graph order), put
    where the last of them stood, where all its inputs are made (a residual's other addend
    too); ``uses`` kept current, so a later match in the same call sees the fused node."""
    graph.nodes[graph.nodes.index(gone[-1])] = fused
    graph.nodes.remove(first)
    for n in gone[:-1]:
        graph.nodes.remove(n)
    uses.producer[fused.outputs[0]] = fused
    old = {id(first), *(id(n) for n in gone)}
    for name in set(fused.inputs) - {""}:
        uses.readers[name] = [fused if id(r) in old else r for r in uses.readers.get(name, ())]


def _epilogue_activation(graph: Graph, uses: Uses, value: str, gelu: bool = True
                         ) -> tuple[str | None, list[Node]]:
    """(the activation, its nodes in graph order, the last making its output) that alone
    reads ``value``: an activation-fusion one (Relu, ..., Relu6, Silu), or GELU when ``gelu``
    (FusedMatMul has it, FusedConv not); (None, [])."""
    act = uses.sole_consumer(value)
    name = _activation(graph, act, value)
    if name is not None:
        return name, [act]
    silu = _silu(uses, value)
    if silu is not None:
        return "Silu", list(silu)
    nodes = _gelu(graph, uses, value) if gelu else None
    if nodes is not None:
        return "Gelu", nodes
    return None, []


def _near(x: float | None, want: float) -> bool:
    return x is not None and abs(x - want) <= 1e-6 * abs(want)


def _gelu(graph: Graph, uses: Uses, x: str) -> list[Node] | None:
    """GELU's nodes reading ``x``, in graph order, when nothing else reads x or any of their
    results but the last: erf(x / sqrt 2) (a Div by sqrt 2 or a Mul by its inverse), plus 1,
    times x, times 0.5, in either of PyTorch's two orders: ``(x * (erf + 1)) * 0.5``
    (nn.GELU) or ``(x * 0.5) * (erf + 1)`` (BERT's gelu)."""
    if x in uses.outputs:
        return None
    readers = uses.readers.get(x, ())
    if len(readers) != 2:
        return None
    scaled = next((n for n in readers if len(n.inputs) == 2 and n.inputs[0] == x and (
        (n.op == "Div" and _near(_scalar(graph, n.inputs[1]), math.sqrt(2))) or
        (n.op == "Mul" and _near(_scalar(graph, n.inputs[1]), math.sqrt(0.5))))), None)
    mul = next((n for n in readers if n is not scaled and n.op == "Mul"), None)
    if scaled is None or mul is None:
        return None
    erf = uses.sole_consumer(scaled.outputs[0])
    if erf is None or erf.op != "Erf":
        return None
    plus = uses.sole_consumer(erf.outputs[0])
    if plus is None or plus.op != "Add" or _scalar(graph, _other(plus, erf.outputs[0]) or "") \
            != 1.0:
        return None
    if _other(mul, x) == plus.outputs[0]:  # nn.GELU: (x * (erf + 1)) * 0.5
        half = uses.sole_consumer(mul.outputs[0])
        if uses.sole_consumer(plus.outputs[0]) is not mul or half is None or \
                half.op != "Mul" or _scalar(graph, _other(half, mul.outputs[0]) or "") != 0.5:
            return None
        nodes = [scaled, erf, plus, mul, half]
    elif _scalar(graph, _other(mul, x) or "") == 0.5:  # BERT: (x * 0.5) * (erf + 1)
        last = uses.sole_consumer(mul.outputs[0])
        if last is None or last.op != "Mul" or uses.sole_consumer(plus.outputs[0]) is not last \
                or sorted(last.inputs) != sorted([mul.outputs[0], plus.outputs[0]]):
            return None
        nodes = [scaled, erf, plus, mul, last]
    else:
        return None
    return sorted(nodes, key=graph.nodes.index)


def _silu(uses: Uses, value: str) -> tuple[Node, Node] | None:
    """(the Sigmoid, the Mul) when ``value`` is read by exactly a Sigmoid of it and a Mul of
    it by that Sigmoid's output (in either order), which nothing else reads: x * sigmoid(x)."""
    if value in uses.outputs:
        return None
    readers = uses.readers.get(value, ())
    if len(readers) != 2:
        return None
    sig = next((n for n in readers if n.op == "Sigmoid"), None)
    mul = next((n for n in readers if n.op == "Mul"), None)
    if sig is None or mul is None or sig.inputs[0] != value:
        return None
    gate = sig.outputs[0]
    if sorted(mul.inputs) != sorted([value, gate]) or uses.sole_consumer(gate) is not mul:
        return None
    return sig, mul


def _activation(graph: Graph, act: Node | None, value: str) -> str | None:
    """The fused activation ``act`` (reading ``value``) is, or None: an op of ACTIVATIONS, or
    Clip to the constant bounds 0 and 6 (Relu6)."""
    if act is None:
        return None
    if act.op == "Clip":
        bounds = [_scalar(graph, i) if i else None for i in act.inputs[1:3]]
        return "Relu6" if act.inputs[0] == value and bounds == [0.0, 6.0] else None
    return act.op if act.op in ACTIVATIONS else None  # no op is named Relu6


class GemmWeightLayout(Pass):
    name = "gemm-weight-layout"
    changes = ("stores a constant Gemm weight read transposed (transB=1, PyTorch's Linear "
               "layout) as its transpose once, and sets transB=0")

    # Why: OpenBLAS packs a transposed B slowly; A @ B on a (K, N) copy measured 1.1-4.3x
    # faster than A @ B.T on the (N, K) original for 2-256 rows (docs/benchmarks.md). The
    # transpose is made once per session, as onnxruntime prepacks its weights.
    def run(self, graph: Graph) -> PassResult:
        specs = None
        moved: dict[str, str] = {}
        done = 0
        for node in graph.nodes:
            if node.op not in ("Gemm", "FusedGemm") or not node.attrs.get("transB", 0):
                continue
            if len(node.inputs) < 2:
                continue
            b = _init(graph, node.inputs[1])
            if b is None or b.ndim != 2 or b.dtype.kind != "f":
                continue
            if specs is None:
                specs = graph.validate(allow_unknown=True)
            name = moved.get(node.inputs[1])
            if name is None:
                name = graph.fresh_name(node.inputs[1] + "_kn")
                arr = frozen(b.T)  # the session's own copy: kernels may lay it out once
                specs[name] = spec_of_array(arr)
            candidate = Node(node.op, [node.inputs[0], name, *node.inputs[2:]],
                             list(node.outputs), {**node.attrs, "transB": 0}, node.name)
            if not same_spec(candidate, specs, [specs.get(o) for o in node.outputs]):
                continue
            if node.inputs[1] not in moved:
                graph.initializers[name] = arr
                moved[node.inputs[1]] = name
            node.inputs, node.attrs = candidate.inputs, candidate.attrs
            done += 1
        return PassResult(done)


def _scalar(graph: Graph, name: str) -> float | None:
    """The value of a constant one-element floating tensor, else None."""
    arr = _init(graph, name)
    if arr is None or arr.size != 1 or arr.dtype.kind != "f":
        return None
    return float(arr.reshape(-1)[0])


def _other(node: Node, name: str) -> str | None:
    """The input of a binary ``node`` that is not ``name`` (None when both or neither are)."""
    a, b = node.inputs[0], node.inputs[1]
    if (a == name) == (b == name):
        return None
    return b if a == name else a


class RMSNormFusion(Pass):
    name = "rms-norm-fusion"
    changes = ("replaces RMS normalization written out over the last axis (LLaMA, Mistral, "
               "T5: Pow(x, 2) or x*x, ReduceMean keeping the axis, Add epsilon, Sqrt, then "
               "Div(1, .) or Reciprocal and Mul by x, or Div(x, .), then Mul by a constant "
               "1-D weight) with one RMSNormalization node")

    # Why: six to seven small nodes per norm, each a kernel call (about 2 us apiece on a small
    # model) and a pass over the activations; onnxruntime fuses the same pattern into its
    # SimplifiedLayerNormalization.
    def run(self, graph: Graph) -> PassResult:
        uses = Uses(graph)
        specs = None
        done = 0
        for reduce in list(graph.nodes):
            if reduce.op != "ReduceMean" or reduce.attrs.get("keepdims", 1) != 1:
                continue
            found = self._match(graph, uses, reduce)
            if found is None:
                continue
            x, eps, weight, last, chain = found
            if specs is None:
                specs = graph.validate(allow_unknown=True)
            xs = specs.get(x)
            if xs is None or not xs.dtype.is_floating or not xs.shape:
                continue
            axes = _init(graph, reduce.inputs[1]) if len(reduce.inputs) > 1 else None
            if axes is None or axes.size != 1 or int(axes.reshape(-1)[0]) % len(xs.shape) != \
                    len(xs.shape) - 1:
                continue
            w = _init(graph, weight)
            if w is None or w.ndim != 1 or w.dtype != xs.dtype.numpy or \
                    w.shape[0] != xs.shape[-1]:
                continue
            fused = Node("RMSNormalization", [x, weight], list(last.outputs),
                         {"axis": -1, "epsilon": eps}, reduce.name)
            if not same_spec(fused, specs, [specs.get(last.outputs[0])]):
                continue
            graph.nodes[graph.nodes.index(last)] = fused
            uses.producer[last.outputs[0]] = fused
            for n in chain:
                graph.nodes.remove(n)
            done += 1
        return PassResult(done)

    @staticmethod
    def _match(graph: Graph, uses: Uses, reduce: Node):
        """(x, epsilon, weight, last node, nodes to drop) of the pattern around ``reduce``."""
        square = uses.producer.get(reduce.inputs[0])
        if square is None or uses.sole_consumer(reduce.inputs[0]) is not reduce:
            return None  # the squares are read only by the mean (x itself may be read anywhere)
        squared = (square.op == "Pow" and _scalar(graph, square.inputs[1]) == 2.0) or \
            (square.op == "Mul" and square.inputs[0] == square.inputs[1])
        if not squared:
            return None
        x = square.inputs[0]
        add = uses.sole_consumer(reduce.outputs[0])
        if add is None or add.op != "Add":
            return None
        eps = _scalar(graph, _other(add, reduce.outputs[0]) or "")
        if eps is None or not eps >= 0:
            return None
        sqrt = uses.sole_consumer(add.outputs[0])
        if sqrt is None or sqrt.op != "Sqrt":
            return None
        step = uses.sole_consumer(sqrt.outputs[0])
        chain = [square, reduce, add, sqrt]
        if step is None:
            return None
        if step.op == "Div" and step.inputs[1] == sqrt.outputs[0] and step.inputs[0] == x:
            normed = step  # x / sqrt(...)
        else:
            reciprocal = step.op == "Reciprocal" or (
                step.op == "Div" and step.inputs[1] == sqrt.outputs[0]
                and _scalar(graph, step.inputs[0]) == 1.0)
            if not reciprocal:
                return None
            normed = uses.sole_consumer(step.outputs[0])
            if normed is None or normed.op != "Mul" or _other(normed, step.outputs[0]) != x:
                return None
            chain.append(step)
        scale = uses.sole_consumer(normed.outputs[0])
        if scale is None or scale.op != "Mul":
            return None
        weight = _other(scale, normed.outputs[0])
        if weight is None or _init(graph, weight) is None:
            return None
        chain.append(normed)
        return x, eps, weight, scale, chain


class SkipLayerNormFusion(Pass):
    name = "skip-layer-norm-fusion"
    changes = ("replaces an Add (a residual connection, optionally after an Add of a constant "
               "bias row) whose sum a LayerNormalization over the last axis reads, with one "
               "SkipLayerNormalization node giving the normalized value and, where anything else "
               "reads it, the sum")

    # Why: transformers normalize right after each residual Add (BERT after every sublayer,
    # GPT-2, ViT and Whisper before the next one). On small models each is two kernel calls of
    # about 2 us; one kernel adds and normalizes each row while it is in registers, as
    # onnxruntime's SkipLayerNormalization does.
    def run(self, graph: Graph) -> PassResult:
        uses = Uses(graph)
        specs = None
        done = 0
        for ln in list(graph.nodes):
            if ln.op != "LayerNormalization" or any(
                    o and (o in uses.outputs or uses.readers.get(o)) for o in ln.outputs[1:]):
                continue
            add = uses.producer.get(ln.inputs[0])
            if add is None or add.op != "Add" or len(ln.inputs) < 2 or \
                    any(_init(graph, i) is None for i in ln.inputs[1:3] if i):
                continue
            if specs is None:
                specs = graph.validate(allow_unknown=True)
            found = self._match(graph, uses, specs, ln, add)
            if found is None:
                continue
            x, skip, bias, dropped = found
            total = add.outputs[0]
            keep_sum = total in uses.outputs or len(uses.readers.get(total, ())) > 1
            b = ln.inputs[2] if len(ln.inputs) > 2 else ""
            fused = Node("SkipLayerNormalization", [x, skip, ln.inputs[1], b, bias],
                         [ln.outputs[0]] + ([total] if keep_sum else []),
                         {"epsilon": ln.attrs.get("epsilon", 1e-5)}, ln.name or add.name)
            want = [specs.get(ln.outputs[0])] + ([specs.get(total)] if keep_sum else [])
            if not same_spec(fused, specs, want):
                continue
            graph.nodes[graph.nodes.index(add)] = fused  # every input is ready where add was
            graph.nodes.remove(ln)
            for node in dropped:
                graph.nodes.remove(node)
            for node in (add, ln, *dropped):
                for i in node.inputs:
                    if i and node in uses.readers.get(i, ()):
                        uses.readers[i].remove(node)
            for i in fused.inputs:
                if i:
                    uses.readers.setdefault(i, []).append(fused)
            for o in fused.outputs:
                uses.producer[o] = fused
            done += 1
        return PassResult(done)

    @staticmethod
    def _match(graph: Graph, uses: Uses, specs: dict, ln: Node, add: Node):
        """(X, Skip, Bias or "", bias Add node to drop or none) of ``add`` under ``ln``, or
        None where the fused op would not compute the same: a normalization over other axes,
        a dtype other than float32/float64, a Scale or B that is not one constant row."""
        out = specs.get(add.outputs[0])
        if out is None or out.dtype.numpy not in (np.float32, np.float64) or not out.shape:
            return None
        axis = ln.attrs.get("axis", -1)
        if axis not in (-1, len(out.shape) - 1):
            return None
        width = out.shape[-1]
        for name in ln.inputs[1:3]:
            arr = _init(graph, name)
            if name and (arr is None or arr.shape != (width,)):
                return None
        a, b = add.inputs[0], add.inputs[1]
        if not a or not b or specs.get(a) is None or specs.get(b) is None:
            return None
        shape = tuple(out.shape)
        for main, skip in ((a, b), (b, a)):  # a bias Add on either side is taken in
            inner = uses.producer.get(main)
            if inner is None or inner.op != "Add" or uses.sole_consumer(main) is not add:
                continue
            for x, bias in ((inner.inputs[0], inner.inputs[1]), (inner.inputs[1], inner.inputs[0])):
                row = _init(graph, bias)
                if row is not None and row.shape == (width,) and specs.get(x) is not None and \
                        tuple(specs[x].shape) == shape:
                    return x, skip, bias, [inner]
        for main, skip in ((a, b), (b, a)):
            if tuple(specs[main].shape) == shape:
                return main, skip, "", []
        return None
