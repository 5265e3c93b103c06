"""Fused ops (domain ``onemodel``) that the runtime's fusion passes produce: a Conv or Gemm with
its following activation applied in place, saving one pass over the output (a Conv also with the
residual Add between them), a chain of
elementwise ops as one node, attention written out as MatMul, scale, mask, Softmax, MatMul, and
a residual Add with the LayerNormalization after it. Inference only."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from ..dtype import FLOATING
from ..errors import ShapeError
from .base import OPS, TensorSpec, broadcast_shapes, defop, same_dtype
from .linalg import _gemm_shape, _matmul_shape, gemm, matmul
from .nn import _conv_shape, conv, layer_normalization
from .specialize import CallSite, specialize, specializer

# "Relu6" is Clip(x, 0, 6) (MobileNetV2's ReLU6): activation fusion takes a Clip with those
# constant bounds, as onnxruntime fuses its Clip into the convolution. "Silu" is x * Sigmoid(x)
# (EfficientNet's and YOLO's SiLU, exported as a Sigmoid and a Mul reading the same value)
ACTIVATIONS = ("Relu", "Sigmoid", "Tanh", "HardSwish", "Relu6", "Silu")


def _sigmoid(y: np.ndarray, out: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-y)) into ``out`` without overflow warnings: exp of -|y| only."""
    e = np.exp(-np.abs(y))
    pos = y >= 0
    np.divide(1, 1 + e, out=out, where=pos)
    np.divide(e, 1 + e, out=out, where=~pos)
    return out


def _activate(y: np.ndarray, activation: str) -> np.ndarray:
    if activation == "":  # a residual FusedConv without an activation after its Add
        return y
    if activation == "Relu":
        return np.maximum(y, 0, out=y)
    if activation == "Tanh":
        return np.tanh(y, out=y)
    if activation == "Sigmoid":
        return _sigmoid(y, y)
    if activation == "Silu":  # as the Sigmoid and the Mul compute it (-inf gives NaN there too)
        return np.multiply(y, _sigmoid(y, np.empty_like(y)), out=y)
    if activation == "Relu6":  # as the Clip op computes it (NaN stays NaN)
        return np.clip(y, y.dtype.type(0), y.dtype.type(6), out=y)
    if activation == "HardSwish":  # MobileNetV3's; the formula of the HardSwish op
        gate = np.clip(y / y.dtype.type(6) + y.dtype.type(0.5), 0, 1)
        return np.multiply(y, gate, out=y)
    raise ShapeError(f"unknown fused activation {activation!r}; expected one of {ACTIVATIONS}")


def _fused_conv_shape(specs, *, activation="Relu", **attrs):
    out = _conv_shape(specs[:3], **attrs)
    z = specs[3] if len(specs) > 3 else None
    if z is not None and (tuple(z.shape) != tuple(out.shape) or z.dtype != out.dtype):
        raise ShapeError(f"FusedConv: Z {z} must have the output's shape and dtype {out}")
    return out


@defop("FusedConv", shape=_fused_conv_shape, domain="onemodel")
def fused_conv(X, W, B=None, Z=None, *, activation="Relu", auto_pad="NOTSET", dilations=None,
               group=1, kernel_shape=None, pads=None, strides=None):
    """Conv, plus ``Z`` when given (the other addend of a residual Add, of the output's shape,
    as onnxruntime's FusedConv takes it), followed by ``activation`` (Relu, Sigmoid, Tanh,
    HardSwish, Relu6 or Silu; "" for none). The Add runs before the activation and after the
    bias, as in the graph it replaces."""
    y = conv.kernel(X, W, B, auto_pad=auto_pad, dilations=dilations, group=group,
                    kernel_shape=kernel_shape, pads=pads, strides=strides)
    if Z is not None:
        y = y + Z
    return _activate(y, activation)


def _fused_gemm_shape(specs, *, activation="Relu", **attrs):
    return _gemm_shape(specs, **attrs)


@defop("FusedGemm", shape=_fused_gemm_shape, domain="onemodel", writes_out=True)
def fused_gemm(A, B, C=None, *, activation="Relu", alpha=1.0, beta=1.0, transA=0, transB=0,
               out=None):
    """Gemm followed by ``activation`` (one of ACTIVATIONS); ``out``: the planned buffer."""
    y = gemm.kernel(A, B, C, alpha=alpha, beta=beta, transA=transA, transB=transB, out=out)
    return _activate(y, activation)


@specializer(fused_gemm.kernel)
def _fused_gemm_at(site: CallSite):
    """The Gemm's own specialized call, then the activation in place."""
    attrs = dict(site.attrs)
    activation = attrs.pop("activation", "Relu")
    product = specialize(gemm.kernel, replace(site, attrs=attrs))
    if product is None or activation not in ACTIVATIONS:
        return None
    if activation == "Relu":  # the common case without _activate's dispatch
        def gemm_relu(A, B, C=None, out=None):
            y = product(A, B, C, out=out)
            return np.maximum(y, 0, out=y)
        return gemm_relu

    def gemm_activation(A, B, C=None, out=None):
        return _activate(product(A, B, C, out=out), activation)
    return gemm_activation


# MatMul with a bias and an activation ------------------------------------------------------------

# what FusedMatMul's activation may be: none, a Conv's and Gemm's, or Gelu (erf form), which
# transformers' feed-forward layers put after their first MatMul and its bias
MATMUL_ACTIVATIONS = ("", *ACTIVATIONS, "Gelu")


def _fused_matmul_shape(specs, *, activation=""):
    a, b = specs[0], specs[1]
    c = specs[2] if len(specs) > 2 else None
    if len(b.shape) != 2 or len(a.shape) < 2:
        raise ShapeError(f"FusedMatMul: A needs two or more axes and B two, got {a} and {b}")
    out = _matmul_shape([a, b])
    if out.dtype not in FLOATING:
        raise ShapeError(f"FusedMatMul is a floating-point op, got {out.dtype.name}")
    if c is not None and (tuple(c.shape) != (b.shape[1],) or c.dtype != out.dtype):
        raise ShapeError(f"FusedMatMul: the bias {c} must be one row of B's columns {b}")
    if activation not in MATMUL_ACTIVATIONS:
        raise ShapeError(f"FusedMatMul: unknown activation {activation!r}; expected one of "
                         f"{MATMUL_ACTIVATIONS}")
    return out


@defop("FusedMatMul", shape=_fused_matmul_shape, domain="onemodel", writes_out=True)
def fused_matmul(A, B, C=None, *, activation="", out=None):
    """``activation(A @ B + C)`` for A of two or more axes by a 2-D B, C one row of B's
    columns: a transformer's Linear (MatMul, the Add of its bias) and the activation after it,
    which its export writes as several nodes (GELU as Div, Erf, Add, Mul, Mul). Runs the ops'
    own kernels in the graph's order; ``out``: the planned buffer."""
    y = matmul.kernel(A, B, out=out)
    if C is not None:
        y = np.add(y, C, out=y)
    if activation == "Gelu":  # as the nodes it replaces: (y * (erf(y / sqrt 2) + 1)) * 0.5
        half, root2 = y.dtype.type(0.5), y.dtype.type(math.sqrt(2))
        g = OPS["Erf"].kernel(y / root2) + y.dtype.type(1)
        return np.multiply(np.multiply(y, g, out=g), half, out=y)
    return _activate(y, activation)


# attention ---------------------------------------------------------------------------------------

def _fused_attention_shape(specs, *, scale=1.0, transpose_output=0):
    q, kt, v = specs[0], specs[1], specs[2]
    mask = specs[3] if len(specs) > 3 else None
    if len(q.shape) < 2 or len(kt.shape) < 2 or len(v.shape) < 2:
        raise ShapeError("FusedAttention: Q, Kt and V must have at least two axes, got "
                         f"{q.shape}, {kt.shape} and {v.shape}")
    same_dtype([s for s in specs if s is not None], FLOATING)
    scores = _matmul_shape([q, kt])
    if mask is not None and broadcast_shapes(scores.shape, mask.shape) != tuple(scores.shape):
        raise ShapeError(f"FusedAttention: the mask {mask.shape} must broadcast to the scores "
                         f"{scores.shape}")
    out = _matmul_shape([scores, v])
    if not transpose_output:
        return out
    if len(out.shape) != 4:
        raise ShapeError(f"FusedAttention: transpose_output needs (batch, heads, rows, "
                         f"columns) results, got {tuple(out.shape)}")
    b, h, r, c = out.shape
    return replace(out, shape=(b, r, h, c))


@defop("FusedAttention", shape=_fused_attention_shape, domain="onemodel", writes_out=True)
def fused_attention(Q, Kt, V, mask=None, *, scale=1.0, transpose_output=0, out=None):
    """softmax(Q @ Kt * scale + mask, last axis) @ V: attention as exported models write it
    out (``Kt`` is the keys already transposed, as their MatMul reads them). With
    ``transpose_output`` the (B, H, S, D) result comes as (B, S, H, D): the Transpose that
    gathers the heads back, which a kernel then writes directly. This reference runs the ops'
    own kernels in the graph's order, so it gives the unfused graph's result; a kernel plugin
    computes it in one pass per query row."""
    scores = matmul.kernel(Q, Kt)
    if scale != 1.0:
        scores = scores * scores.dtype.type(scale)
    if mask is not None:
        scores = scores + mask
    probs = OPS["Softmax"].kernel(scores, axis=-1)
    if not transpose_output:
        return matmul.kernel(probs, V, out=out)
    y = matmul.kernel(probs, V).transpose(0, 2, 1, 3)
    if out is None:
        return y
    np.copyto(out, y)
    return out


# residual connection and layer normalization ----------------------------------------------------

def _skip_layer_norm_shape(specs, *, epsilon=1e-5):
    x, skip = specs[0], specs[1]
    dt = same_dtype([s for s in specs if s is not None], FLOATING)
    if not x.shape:
        raise ShapeError("SkipLayerNormalization: X needs at least one axis")
    if len(skip.shape) > len(x.shape) or \
            broadcast_shapes(x.shape, skip.shape) != tuple(x.shape):
        raise ShapeError(f"SkipLayerNormalization: Skip {tuple(skip.shape)} must broadcast "
                         f"onto X {tuple(x.shape)}")
    width = x.shape[-1]
    for name, spec in zip(("Scale", "B", "Bias"), specs[2:]):
        if spec is not None and (len(spec.shape) != 1 or
                                 broadcast_shapes(spec.shape, (width,)) != (width,)):
            raise ShapeError(f"SkipLayerNormalization: {name} {tuple(spec.shape)} must be one "
                             f"row of X's last axis ({width})")
    return [TensorSpec(x.shape, dt), TensorSpec(x.shape, dt)]


@defop("SkipLayerNormalization", shape=_skip_layer_norm_shape, domain="onemodel",
       outputs=("Y", "Sum"), new_outputs=True)
def skip_layer_normalization(X, Skip, Scale, B=None, Bias=None, *, epsilon=1e-5):
    """LayerNormalization over the last axis of ``Sum = (X + Bias) + Skip``: a residual
    connection and the norm after it, as onnxruntime's SkipLayerNormalization. ``Sum`` is the
    second output (the residual stream a pre-norm transformer reads again); the additions run
    in that order, as the graph it replaces wrote them."""
    total = (X + Bias if Bias is not None else X) + Skip
    y = layer_normalization.kernel(total, Scale, B, axis=-1, epsilon=epsilon)[0]
    return y, total


# layer normalization over the channels of channels-first data -----------------------------------

def _channel_layer_norm_shape(specs, *, epsilon=1e-5):
    x = specs[0]
    dt = same_dtype([s for s in specs if s is not None], FLOATING)
    if len(x.shape) < 3:
        raise ShapeError(f"ChannelLayerNormalization: X needs batch, channel and spatial axes "
                         f"(N, C, ...), got {tuple(x.shape)}")
    for name, spec in zip(("Scale", "B"), specs[1:]):
        if spec is not None and tuple(spec.shape) != (x.shape[1],):
            raise ShapeError(f"ChannelLayerNormalization: {name} {tuple(spec.shape)} must be "
                             f"one value per channel of X {tuple(x.shape)}")
    return TensorSpec(x.shape, dt)


@defop("ChannelLayerNormalization", shape=_channel_layer_norm_shape, domain="onemodel",
       writes_out=True)
def channel_layer_normalization(X, Scale, B=None, *, epsilon=1e-5, out=None):
    """LayerNormalization over the channels (axis 1) of (N, C, ...) data, at each pixel:
    ConvNeXt's channels-first LayerNorm (torchvision's LayerNorm2d), which exports write as a
    Transpose to channels-last, a LayerNormalization over the last axis and the Transpose
    back. This reference runs those three ops' kernels; ``out``: the planned buffer."""
    nd = X.ndim
    y = layer_normalization.kernel(X.transpose(0, *range(2, nd), 1), Scale, B, axis=-1,
                                   epsilon=epsilon)[0].transpose(0, nd - 1, *range(1, nd - 1))
    if out is None:
        return y
    np.copyto(out, y)
    return out


# elementwise chains ------------------------------------------------------------------------------

def chain_operands(op: str) -> int | None:
    """Tensor operands of ``op`` in an elementwise chain (``OpDef.chain_operands``), or None
    when it cannot join one. An op's other inputs (Clip's bounds, Pow's exponent) must be
    constant scalars and its attributes numbers: they travel in the program as literals."""
    opdef = OPS.get(op)
    return None if opdef is None else opdef.chain_operands


def chain_literals(op: str) -> list[str]:
    """The names of the literals a step of ``op`` carries after its operands: its inputs past
    the tensor operands, then its attributes, in signature order."""
    opdef = OPS[op]
    return [*opdef.inputs[opdef.chain_operands:], *opdef.attrs]


def parse_program(program, n_inputs: int) -> list[tuple[str, list[str], list[float]]]:
    """``program`` steps ``"Op ref [ref] [literal ...]"`` (refs ``x<k>``: input k, ``t<k>``:
    step k's result; literals as :func:`chain_literals` lists them, floats, ``nan`` for an
    omitted optional input, e.g. ``Clip t0 0.0 nan``, ``HardSigmoid x0 0.2 0.5``) as
    (op, refs, literals)."""
    steps = []
    for k, text in enumerate(program):
        parts = str(text).split()
        arity = chain_operands(parts[0]) if parts else None
        if arity is None:
            chainable = sorted(n for n, o in OPS.items() if o.chain_operands is not None)
            raise ShapeError(f"FusedElementwise step {k} {text!r}: the op must be one of "
                             f"{', '.join(chainable)}")
        op = parts[0]
        names = chain_literals(op)
        refs, lits = parts[1:1 + arity], parts[1 + arity:]
        if len(refs) != arity or len(lits) != len(names):
            raise ShapeError(f"FusedElementwise step {k} {text!r}: {op} takes {arity} operand(s)"
                             + (f" and the literals {', '.join(names)}" if names else ""))
        for r in refs:
            kind, idx = r[:1], r[1:]
            limit = n_inputs if kind == "x" else k
            if kind not in ("x", "t") or not idx.isdigit() or int(idx) >= limit:
                raise ShapeError(f"FusedElementwise step {k} {text!r}: operand {r!r} names no "
                                 f"input (x0..x{n_inputs - 1}) or earlier step")
        try:
            values = [float(v) for v in lits]
        except ValueError:
            raise ShapeError(f"FusedElementwise step {k} {text!r}: literals must be numbers") \
                from None
        steps.append((op, refs, values))
    if not steps:
        raise ShapeError("FusedElementwise needs a program of at least one step")
    return steps


def _fused_elementwise_shape(specs, *, program=()):
    parse_program(program, len(specs))
    dt = same_dtype(list(specs), FLOATING)
    return TensorSpec(broadcast_shapes(*[s.shape for s in specs]), dt)


@defop("FusedElementwise", shape=_fused_elementwise_shape, domain="onemodel")
def fused_elementwise(*inputs, program=()):
    """A chain of elementwise ops (bias, activation, residual add, scale, clip, power) as one
    node, or one such op whose reference makes several passes; the runtime's fusion pass makes
    it and a kernel plugin runs it in one pass. This reference runs the steps one by one with
    the ops' own kernels."""
    values: list = []
    for op, refs, lits in parse_program(program, len(inputs)):
        args = [inputs[int(r[1:])] if r[0] == "x" else values[int(r[1:])] for r in refs]
        opdef = OPS[op]
        consts = opdef.inputs[opdef.chain_operands:]
        dt = args[0].dtype
        args += [None if name in opdef.optional and np.isnan(v) else np.asarray(v, dt)
                 for name, v in zip(consts, lits)]
        attrs = dict(zip(opdef.attrs, lits[len(consts):]))
        values.append(opdef.kernel(*args, **attrs))
    return values[-1]
