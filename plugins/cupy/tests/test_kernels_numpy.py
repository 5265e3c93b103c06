"""Every kernel of the plugin run with numpy as its array namespace, against the reference kernel
of its op (``OPS[op].kernel``) on random inputs of odd shapes and several dtypes. The kernels are
the code that runs on the GPU with ``xp = cupy``; here their logic (ONNX semantics, window
geometry, broadcasting, dtype rules) is proved on any machine."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

from onemodel.cupy import fused, plugin
from onemodel.tensors import DType
from onemodel.tensors.ops import OPS
from onemodel.tensors.ops.fused import parse_program
from onemodel.tensors.registry import resolve

rng = np.random.default_rng(1234)


def r(*shape, dtype=np.float32, lo=-3.0, hi=3.0):
    if np.dtype(dtype).kind in "iu":
        lo_i = 0 if np.dtype(dtype).kind == "u" else int(lo)
        return rng.integers(lo_i, int(hi) + 1, shape).astype(dtype)
    if np.dtype(dtype) == np.bool_:
        return rng.random(shape) < 0.5
    return rng.uniform(lo, hi, shape).astype(dtype)


def pos(*shape, dtype=np.float32):
    return r(*shape, dtype=dtype, lo=0.1, hi=4.0)


def i64(*values):
    return np.asarray(values, np.int64)


F = (np.float32, np.float64, np.float16)
NUM = (np.float32, np.float64, np.int32, np.int64)

# (op, inputs, attrs)
CASES: list[tuple[str, list, dict]] = []


def case(op, inputs, **attrs):
    CASES.append((op, inputs, attrs))


for dt in NUM + (np.float16, np.uint8):
    for op in ("Add", "Sub", "Mul"):
        case(op, [r(3, 1, 5, dtype=dt), r(4, 5, dtype=dt)])
    if dt != np.uint8:
        case("Neg", [r(2, 7, dtype=dt)])
    case("Abs", [r(2, 7, dtype=dt)])
    case("Relu", [r(3, 5, dtype=dt)])
    case("Sign", [r(3, 5, dtype=dt)])
    case("Clip", [r(4, 6, dtype=dt), np.asarray(0, dt), np.asarray(2, dt)])
    case("Clip", [r(4, 6, dtype=dt), np.asarray(1, dt)])
    case("Clip", [r(4, 6, dtype=dt)])
    case("Sum", [r(3, 1, dtype=dt), r(1, 4, dtype=dt), r(4, dtype=dt)])
    case("Max", [r(3, 1, dtype=dt), r(1, 4, dtype=dt), r(4, dtype=dt)])
    case("Min", [r(3, 1, dtype=dt), r(1, 4, dtype=dt)])
    case("Identity", [r(3, 2, dtype=dt)])
    for op in ("Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"):
        case(op, [r(3, 4, dtype=dt), r(4, dtype=dt)])
for dt in (np.int32, np.int64):
    nonzero = r(5, 3, dtype=dt, lo=1, hi=4) * np.where(rng.random((5, 3)) < 0.5, 1, -1).astype(dt)
    case("Div", [r(5, 3, dtype=dt, lo=-9, hi=9), nonzero])
    case("Pow", [r(4, 3, dtype=dt, lo=-3, hi=3), r(4, 3, dtype=dt, lo=0, hi=3)])
for dt in F:
    case("Div", [r(5, 3, dtype=dt), pos(3, dtype=dt)])
    case("Pow", [pos(4, 3, dtype=dt), r(3, dtype=dt)])
    for op in ("Exp", "Tanh", "Erf", "Sigmoid"):
        case(op, [r(3, 7, dtype=dt, lo=-12, hi=12)])
    case("Log", [pos(2, 9, dtype=dt)])
    case("Sqrt", [pos(2, 9, dtype=dt)])
    case("Reciprocal", [pos(2, 9, dtype=dt)])
    case("LeakyRelu", [r(3, 5, dtype=dt)], alpha=0.2)
    case("Gelu", [r(3, 5, dtype=dt)])
    case("Gelu", [r(3, 5, dtype=dt)], approximate="tanh")
    case("Where", [r(3, 1, dtype=np.bool_), r(3, 4, dtype=dt), r(4, dtype=dt)])
for op in ("Not",):
    case(op, [r(3, 4, dtype=np.bool_)])
for op in ("And", "Or", "Equal"):
    case(op, [r(3, 4, dtype=np.bool_), r(4, dtype=np.bool_)])
case("Sigmoid", [np.asarray([-np.inf, np.inf, np.nan, 0.0, -100.0, 100.0], np.float32)])
case("Relu", [np.asarray([np.nan, -0.0, -1.0, 2.0], np.float32)])
for dt in F:
    case("ReluGrad", [r(3, 5, dtype=dt), r(3, 5, dtype=dt)])
case("ReluGrad", [np.asarray([-1.0, -1.0, 0.0, np.nan, 2.0], np.float32),
                  np.asarray([np.inf, -3.0, 5.0, 1.0, np.nan], np.float32)])
for src, to in ((np.float32, DType.I32), (np.float64, DType.F16), (np.int64, DType.F32),
                (np.bool_, DType.F32), (np.float32, DType.BOOL), (np.float32, DType.F32),
                (np.int32, DType.U8), (np.float32, DType.BF16), (np.float32, DType.F8E4M3FN)):
    case("Cast", [r(3, 5, dtype=src, lo=-300, hi=300)], to=to)

# reductions
for dt in (np.float32, np.float64, np.int64, np.int32):
    x = r(3, 4, 5, dtype=dt)
    for op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin"):
        case(op, [x, i64(0, 2)])
        case(op, [x, i64(-1)], keepdims=0)
        case(op, [x])
        case(op, [x, i64()], keepdims=0)
        case(op, [x, i64()], noop_with_empty_axes=1)
    for op in ("ArgMax", "ArgMin"):
        ties = r(4, 6, 3, dtype=dt, lo=0, hi=2)
        case(op, [ties], axis=1)
        case(op, [ties], axis=-1, keepdims=0)
        case(op, [ties], axis=0, select_last_index=1)
for op in ("ReduceMax", "ReduceMin", "ReduceSum"):
    case(op, [r(3, 0, 2), i64(1)])
    case(op, [r(3, 0, 2), i64(1)], keepdims=0)
case("ReduceMax", [np.asarray([[1.0, np.nan], [2.0, 3.0]], np.float32), i64(1)])

# shape ops
x = r(2, 3, 4, 5)
for target, az in (((0, -1), 0), ((4, 0, 10), 0), ((-1,), 0), ((2, 3, 20), 1), ((0, 3, 4, 5), 0)):
    case("Reshape", [x, i64(*target)], allowzero=az)
for axis in (0, 1, -1, 3, 4):
    case("Flatten", [x], axis=axis)
case("Transpose", [x])
case("Transpose", [x], perm=(1, 0, 3, 2))
case("Squeeze", [r(1, 3, 1, 2)])
case("Squeeze", [r(1, 3, 1, 2), i64(-2)])
case("Squeeze", [r(1, 3, 1, 2), i64(0, 2)])
case("Unsqueeze", [r(3, 2), i64(0, -1)])
case("Unsqueeze", [r(3, 2), i64(1)])
case("Expand", [r(3, 1), i64(2, 1, 4)])
case("Expand", [r(3, 1), i64(3, 1)])
case("Concat", [r(2, 3, 4), r(2, 1, 4), r(2, 5, 4)], axis=1)
case("Concat", [r(2, 3, dtype=np.int64), r(2, 2, dtype=np.int64)], axis=-1)
for starts, ends, axes, steps in (((1,), (3,), None, None), ((-1, 0), (-10**9, 9), (0, 2), (-1, 2)),
                                  ((0, 4), (9, -1), (-1, 1), (3, -1)), ((10,), (20,), (3,), None)):
    case("Slice", [x, i64(*starts), i64(*ends), *([] if axes is None else [i64(*axes)]),
                   *([] if steps is None else [i64(*steps)])])
case("Gather", [x, i64(0, -1, 2, 1)], axis=1)
case("Gather", [r(5, 3), np.asarray([[0, -5], [4, 2]], np.int32)])
case("Gather", [r(4, 6, dtype=np.int64), i64(5)], axis=-1)
case("Shape", [x])
case("Shape", [x], start=1, end=-1)

# matrix products
for dt in F[:2]:
    case("MatMul", [r(2, 3, 4, dtype=dt), r(4, 5, dtype=dt)])
    case("MatMul", [r(4, dtype=dt), r(3, 4, 5, dtype=dt)])
    case("MatMul", [r(3, 4, dtype=dt), r(4, dtype=dt)])
    case("Gemm", [r(3, 4, dtype=dt), r(4, 5, dtype=dt)])
    case("Gemm", [r(4, 3, dtype=dt), r(5, 4, dtype=dt), r(5, dtype=dt)], transA=1, transB=1,
         alpha=0.5, beta=2.0)
    case("Gemm", [r(3, 4, dtype=dt), r(5, 4, dtype=dt), r(3, 1, dtype=dt)], transB=1)
    for act in ("Relu", "Sigmoid", "Tanh", "Relu6", "Silu"):
        case("FusedGemm", [r(3, 4, dtype=dt), r(4, 5, dtype=dt), r(5, dtype=dt)], activation=act)
    for act in ("", "Relu", "Gelu"):
        case("FusedMatMul", [r(2, 3, 4, dtype=dt), r(4, 5, dtype=dt), r(5, dtype=dt)],
             activation=act)
    case("FusedMatMul", [r(3, 4, dtype=dt), r(4, 5, dtype=dt)], activation="Silu")

# convolution
for dt in F[:2]:
    case("Conv", [r(2, 3, 9, 7, dtype=dt), r(4, 3, 3, 3, dtype=dt), r(4, dtype=dt)],
         pads=(1, 1, 1, 1))
    case("Conv", [r(1, 4, 11, 8, dtype=dt), r(6, 2, 3, 2, dtype=dt)], group=2, strides=(2, 1),
         dilations=(1, 2), pads=(0, 1, 2, 0))
    case("Conv", [r(2, 5, 7, 7, dtype=dt), r(5, 1, 3, 3, dtype=dt), r(5, dtype=dt)], group=5,
         auto_pad="SAME_UPPER", strides=(2, 2))
    case("Conv", [r(2, 3, 8, 9, dtype=dt), r(2, 3, 2, 3, dtype=dt)], auto_pad="SAME_LOWER")
    case("Conv", [r(2, 3, 8, 9, dtype=dt), r(2, 3, 2, 3, dtype=dt)], auto_pad="VALID",
         strides=(3, 2))
    case("Conv", [r(3, 2, 13, dtype=dt), r(4, 2, 4, dtype=dt), r(4, dtype=dt)], strides=(3,),
         pads=(2, 1))
    case("Conv", [r(1, 2, 5, 4, 6, dtype=dt), r(3, 2, 2, 3, 2, dtype=dt)], pads=(1, 0, 1, 0, 1, 1))
    case("Conv", [r(2, 3, 5, 5, dtype=dt), r(6, 3, 1, 1, dtype=dt)])
    case("Conv", [r(2, 4, 6, 6, dtype=dt), r(4, 4, 3, 3, dtype=dt)], kernel_shape=(3, 3),
         pads=(1, 1, 1, 1))
    for act in ("Relu", "Sigmoid", "Tanh", "HardSwish", "Relu6", "Silu"):
        case("FusedConv", [r(2, 3, 6, 5, dtype=dt), r(4, 3, 3, 3, dtype=dt), r(4, dtype=dt)],
             activation=act, pads=(1, 1, 1, 1))
    for act in ("", "Relu"):  # a residual connection's addend Z
        case("FusedConv", [r(2, 3, 6, 5, dtype=dt), r(4, 3, 3, 3, dtype=dt), r(4, dtype=dt),
                           r(2, 4, 6, 5, dtype=dt)], activation=act, pads=(1, 1, 1, 1))

# pooling
for dt in F[:2]:
    x = r(2, 3, 11, 9, dtype=dt)
    for op in ("MaxPool", "AveragePool"):
        case(op, [x], kernel_shape=(3, 3), strides=(2, 2))
        case(op, [x], kernel_shape=(3, 2), strides=(2, 2), ceil_mode=1, pads=(1, 0, 1, 1))
        case(op, [x], kernel_shape=(2, 2), auto_pad="SAME_UPPER", strides=(2, 2))
        case(op, [x], kernel_shape=(2, 3), auto_pad="SAME_LOWER")
        case(op, [r(2, 3, 10, dtype=dt)], kernel_shape=(4,), strides=(3,), pads=(2, 2))
        case(op, [r(1, 2, 5, 6, 7, dtype=dt)], kernel_shape=(2, 2, 3), strides=(2, 1, 2))
    case("MaxPool", [x], kernel_shape=(2, 2), dilations=(2, 2), pads=(1, 1, 1, 1))
    case("AveragePool", [x], kernel_shape=(3, 3), pads=(1, 1, 1, 1), count_include_pad=1)
    case("AveragePool", [x], kernel_shape=(3, 3), pads=(1, 2, 2, 1), count_include_pad=1,
         ceil_mode=1, strides=(2, 2))
    case("GlobalAveragePool", [x])
    case("GlobalMaxPool", [x])
    case("GlobalAveragePool", [r(2, 3, 4, 5, 6, dtype=dt)])
case("MaxPool", [r(2, 3, 7, 7, dtype=np.int32, lo=-50, hi=50)], kernel_shape=(3, 3),
     pads=(1, 1, 1, 1))

# normalization and softmax
for dt in F:
    c = 4
    case("BatchNormalization", [r(2, c, 5, 3, dtype=dt), r(c, dtype=dt), r(c, dtype=dt),
                                r(c, dtype=dt), pos(c, dtype=dt)], epsilon=1e-3)
    case("BatchNormalization", [r(6, c, dtype=dt), r(c, dtype=dt), r(c, dtype=dt),
                                r(c, dtype=dt), pos(c, dtype=dt)])
    case("LayerNormalization", [r(3, 4, 7, dtype=dt), r(7, dtype=dt), r(7, dtype=dt)])
    case("LayerNormalization", [r(3, 4, 7, dtype=dt), r(4, 7, dtype=dt)], axis=1, epsilon=1e-2)
    case("LayerNormalization", [r(3, 4, 7, dtype=dt), r(7, dtype=dt)], stash_type=0)
    case("ChannelLayerNormalization", [r(2, 6, 5, 3, dtype=dt), r(6, dtype=dt), r(6, dtype=dt)])
    case("ChannelLayerNormalization", [r(3, 4, 7, dtype=dt), r(4, dtype=dt)], epsilon=1e-2)
    for op in ("Softmax", "LogSoftmax"):
        case(op, [r(3, 4, 7, dtype=dt, lo=-30, hi=30)])
        case(op, [r(3, 4, 7, dtype=dt)], axis=0)
        case(op, [r(3, 0, 2, dtype=dt)], axis=1)

# fused elementwise chains (the programs the runtime's fusion pass writes)
PROGRAMS = [
    (["Add x0 x1", "Relu t0"], 2),
    (["Mul x0 x1", "Add t0 x2", "Sigmoid t1", "Clip t2 0.1 nan"], 3),
    (["Sub x0 x1", "Div t0 x2", "Tanh t1", "Abs t2", "Sqrt t3", "Neg t4"], 3),
    (["Mul x0 x1", "Erf t0", "Add t1 x1", "Mul t2 x0", "Exp t3", "Clip t4 nan 2.5"], 2),
    (["Clip x0 -1 1", "Relu t0", "Add t1 t0"], 1),
]
for program, n in PROGRAMS:
    for dt in F:
        shapes = [(2, 3, 4, 5), (1, 3, 1, 1), (4, 1)][:n]
        case("FusedElementwise", [pos(*s, dtype=dt) if k == 2 else r(*s, dtype=dt)
                                  for k, s in enumerate(shapes)], program=program)

KERNELS = {op: resolve(impl) for op, (impl, _) in plugin.KERNELS.items()}


def _tol(arrays):
    dts = {np.dtype(a.dtype) for a in arrays if isinstance(a, np.ndarray)}
    if np.dtype(np.float16) in dts:
        return 2e-3, 2e-3
    if np.dtype(np.float32) in dts:
        return 2e-5, 1e-5
    return 1e-12, 1e-12


@pytest.mark.parametrize("op, inputs, attrs", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_kernel_matches_the_reference(op, inputs, attrs):
    want = OPS[op].kernel(*[a.copy() for a in inputs], **attrs)
    got = KERNELS[op](*inputs, **attrs)
    wants = want if isinstance(want, tuple) else (want,)
    gots = got if isinstance(got, tuple) else (got,)
    assert len(gots) == len(wants)
    rtol, atol = _tol(inputs)
    for g, w in zip(gots, wants):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        if w.dtype.kind in "fc":
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol,
                                       atol=atol, equal_nan=True)
        else:
            np.testing.assert_array_equal(g, w)


def test_every_registered_kernel_is_tested():
    assert set(KERNELS) == {c[0] for c in CASES}


def test_bad_calls_fail_as_the_reference_does():
    with pytest.raises(IndexError, match="out of range"):
        KERNELS["Gather"](r(3, 4), i64(0, 3), axis=0)
    with pytest.raises(ValueError, match="squeeze"):
        KERNELS["Squeeze"](r(2, 3), i64(1))
    with pytest.raises(ValueError, match="approximate"):
        KERNELS["Gelu"](r(2, 3), approximate="fast")
    with pytest.raises(ValueError, match="channels"):
        KERNELS["Conv"](r(1, 3, 5, 5), r(2, 2, 3, 3))


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler to check the generated "
                                                        "FusedElementwise source with")
@pytest.mark.parametrize("program, n", PROGRAMS)
def test_generated_kernel_source_computes_the_chain(program, n, tmp_path):
    """The C body that becomes the GPU's ElementwiseKernel, compiled here as plain C (the same
    expressions: casts, ternaries, exp/erf/tanh/fabs/sqrt) over double inputs and compared with
    the reference chain: the code generation is proved without a GPU."""
    values = [r(40, dtype=np.float64) if k != 2 else pos(40, dtype=np.float64) for k in range(n)]
    values[0][:4] = [np.nan, np.inf, -np.inf, 0.0]
    body = fused.source(parse_program(program, n), n)
    params = ", ".join(f"T x{j}" for j in range(n))
    c = "\n".join([
        "#include <math.h>", "#include <stdio.h>", "typedef double C;", "typedef double T;",
        f"static double f({params}) {{ T y;", body, "return y; }",
        "int main(void) {",
        *(f"static const double in{j}[] = {{{', '.join(_c(v) for v in values[j])}}};"
          for j in range(n)),
        f"for (int i = 0; i < {len(values[0])}; i++) printf(\"%.17g\\n\", f("
        + ", ".join(f"in{j}[i]" for j in range(n)) + "));",
        "return 0; }"])
    src = tmp_path / "chain.c"
    src.write_text(c)
    exe = tmp_path / "chain"
    subprocess.run(["cc", "-std=c99", "-O0", "-o", str(exe), str(src), "-lm"], check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()
    got = np.asarray([float(v) for v in out])
    want = OPS["FusedElementwise"].kernel(*values, program=program)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14, equal_nan=True)


def _c(v: float) -> str:
    if np.isnan(v):
        return "NAN"
    if np.isinf(v):
        return "INFINITY" if v > 0 else "-INFINITY"
    return repr(float(v))
