"""The low-precision DTypes (bfloat16, float8, float4, int4/int2; values from ml_dtypes) and the
quantization ops, checked against independent implementations: PyTorch's bfloat16/float8
conversions, onnxruntime's Cast and quantization kernels, and exhaustive code tables."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from onemodel.tensors import DType, DTypeError, OneModelError, Tensor

F8 = [DType.F8E4M3FN, DType.F8E4M3FNUZ, DType.F8E5M2, DType.F8E5M2FNUZ]
SPECIALS = np.array([0.0, -0.0, 0.1, -0.3, 1.0, 1.0625, 3.14159, 240.0, 250.0, 448.0, 464.0,
                     500.0, 57344.0, 61440.0, 1e6, -1e6, 1e-9, -1e-9, 2.0 ** -10, np.inf,
                     -np.inf, np.nan], np.float32)


def _cast(x: np.ndarray, to: DType, **attrs) -> np.ndarray:
    return Tensor(x).cast(to).numpy() if not attrs else _run_op("Cast", [x], to=to, **attrs)


def _run_op(op: str, arrays, **attrs):
    from onemodel.tensors.dispatch import dispatch

    out = dispatch(op, [None if a is None else Tensor(a) for a in arrays], attrs)
    return tuple(o.numpy() for o in out) if isinstance(out, tuple) else out.numpy()


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint16 if a.dtype.itemsize == 2 else np.uint8)


# dtypes ----------------------------------------------------------------------------------------

_FRESH = """
import sys
import numpy as np
import onemodel.runtime, onemodel.training, onemodel.tracing
from onemodel.tensors import DType, Tensor
before = 'ml_dtypes' in sys.modules
assert (Tensor(np.ones(3, np.float32)) * 2).numpy().tolist() == [2.0, 2.0, 2.0]
assert DType.from_numpy(np.float32) is DType.F32 and DType.lookup(np.dtype('V2')) is None
still = 'ml_dtypes' in sys.modules
{first_use}
print(before, still, 'ml_dtypes' in sys.modules, result)
"""


@pytest.mark.parametrize("first_use, expected", [
    ("result = DType.BF16.numpy.name", "bfloat16"),
    ("result = DType.from_numpy('float8_e4m3fn').name", "F8E4M3FN"),
    ("result = DType.of('bfloat16').itemsize", "2"),
    ("result = Tensor(np.array([1.5, 3.3], np.float32)).cast(DType.BF16).numpy().tolist()",
     "[1.5, 3.296875]"),
    # the caller imported ml_dtypes and passes its array: its dtype must be known all the same
    ("import ml_dtypes; result = DType.from_numpy(np.zeros(1, ml_dtypes.float8_e5m2).dtype).name",
     "F8E5M2"),
    ("import ml_dtypes; result = DType.lookup(np.zeros(1, ml_dtypes.int4).dtype).name", "I4"),
])
def test_ml_dtypes_is_imported_on_first_use_of_a_narrow_type(first_use, expected):
    """Its extension takes most of a second to load on some CPUs: a float32 program must not pay
    it, and the first use of a narrow type, from any side, must find the type all the same."""
    import subprocess
    import sys

    code = _FRESH.format(first_use=first_use)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    before, still, after, result = out.stdout.split(" ", 3)
    assert (before, still, after) == ("False", "False", "True")
    assert result.strip() == expected


@pytest.mark.parametrize("dt", list(DType))
def test_every_dtype_maps_to_numpy_and_back(dt):
    assert DType.from_numpy(dt.numpy) is dt
    assert DType.of(dt.value) is dt and DType.of(dt.name) is dt
    assert dt.bits in (2, 4, 8, 16, 32, 64)


def test_storage_types_are_not_floating_and_do_not_promote():
    assert DType.BF16.is_floating and not DType.BF16.is_storage
    for dt in F8 + [DType.I4, DType.U4, DType.F4E2M1FN, DType.F8E8M0FNU, DType.I2, DType.U2]:
        assert dt.is_storage and not dt.is_floating
    a = Tensor(np.ones(3, ml_dtypes.float8_e4m3fn))
    with pytest.raises(DTypeError, match="Add.*F8E4M3FN|F8E4M3FN.*Add"):
        a + a
    with pytest.raises(DTypeError, match="MatMul.*I4|I4.*MatMul"):
        Tensor(np.ones((2, 2), ml_dtypes.int4)) @ Tensor(np.ones((2, 2), ml_dtypes.int4))


def test_tensors_of_the_new_dtypes():
    t = Tensor([1.5, -2.0, 3.0], dtype=DType.BF16)
    assert t.dtype is DType.BF16 and t.numpy().dtype == ml_dtypes.bfloat16
    z = Tensor.zeros(DType.F8E5M2, 2, 3)
    assert z.dtype is DType.F8E5M2 and z.shape == (2, 3)
    q = t.cast(DType.I4)
    assert q.dtype is DType.I4 and q.numpy().astype(np.int8).tolist() == [1, -2, 3]
    # data movement works on every dtype
    r = Tensor(np.arange(6).astype(ml_dtypes.int4).reshape(2, 3))
    assert r.reshape(3, 2).transpose(1, 0).dtype is DType.I4
    assert r.reshape(3, 2).numpy().astype(np.int8).tolist() == [[0, 1], [2, 3], [4, 5]]
    assert Tensor(np.ones(2, ml_dtypes.bfloat16)).float().dtype is DType.F32


# Cast ------------------------------------------------------------------------------------------

def test_bfloat16_rounds_like_torch():
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(0).standard_normal(4096).astype(np.float32) * 1e3
    x = np.concatenate([x, SPECIALS, np.float32([1 + 2 ** -8, 1 + 3 * 2 ** -8, 3.4e38])])
    ours = _cast(x, DType.BF16)
    ref = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    nan = np.isnan(x)  # NaN payloads differ between libraries
    assert np.array_equal(_bits(ours)[~nan], ref[~nan])
    assert np.isnan(ours[nan].astype(np.float32)).all()
    back = _cast(ours, DType.F32)
    assert np.array_equal(back, torch.from_numpy(x).to(torch.bfloat16).float().numpy(),
                          equal_nan=True)


@pytest.mark.parametrize("dt,name", [(DType.F8E4M3FN, "float8_e4m3fn"),
                                     (DType.F8E5M2, "float8_e5m2")])
def test_float8_against_torch(dt, name):
    """torch converts without saturating; with saturate=1 ONNX clamps to the largest finite
    value first (Inf included)."""
    torch = pytest.importorskip("torch")
    tdt = getattr(torch, name)
    x = np.concatenate([SPECIALS, np.random.default_rng(1).standard_normal(2000)
                        .astype(np.float32) * 300])
    x = x[~np.isnan(x)]  # NaN payloads differ between libraries
    big = float(ml_dtypes.finfo(dt.numpy).max)
    ref_sat = torch.from_numpy(np.clip(x, -big, big)).to(tdt).view(torch.uint8).numpy()
    assert np.array_equal(_bits(_cast(x, dt)), ref_sat)
    finite = x[np.abs(x) <= big]  # torch's overflow encodings differ by type: compare in range
    ref = torch.from_numpy(finite).to(tdt).view(torch.uint8).numpy()
    assert np.array_equal(_bits(_cast(finite, dt, saturate=0)), ref)


@pytest.mark.parametrize("dt", F8 + [DType.F4E2M1FN, DType.F8E8M0FNU, DType.BF16])
def test_every_code_round_trips_through_float32(dt):
    codes = np.arange(256 if dt.bits == 8 else 16 if dt.bits == 4 else 65536, dtype=np.uint32)
    vals = codes.astype(np.uint16 if dt.bits == 16 else np.uint8).view(dt.numpy)
    f = _cast(vals, DType.F32)
    back = _cast(f, dt, saturate=0) if dt in F8 else _cast(f, dt)  # keep E5M2's infinities
    same = (_bits(back) == _bits(vals)) | np.isnan(f)
    assert same.all()


@pytest.mark.parametrize("saturate", [1, 0])
@pytest.mark.parametrize("dt", F8 + [DType.I4, DType.U4, DType.BF16])
def test_cast_matches_onnxruntime(dt, saturate):
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    from onemodel.onnx.dtypes import TO_ONNX

    if dt in (DType.I4, DType.U4):
        # in range: float -> integer out of range is undefined in ONNX (ORT wraps, ml_dtypes
        # and the ONNX test data give 0)
        x = np.arange(0, 16).astype(np.float32) if dt is DType.U4 else \
            np.arange(-8, 8).astype(np.float32)
        attrs = {}
    else:
        x = np.concatenate([SPECIALS, np.random.default_rng(2).standard_normal(500)
                            .astype(np.float32) * 200])
        attrs = {"saturate": saturate} if dt in F8 else {}
        if dt in F8 and not saturate:
            # just above the largest finite value (x rounds to the next grid point, which the
            # type cannot hold) the ONNX table says NaN (Inf for E5M2), as ml_dtypes does;
            # onnxruntime 1.32 and torch give the largest value there (and NaN for E5M2's tie
            # 61440): compare outside that band
            big = float(ml_dtypes.finfo(dt.numpy).max)
            x = x[~((np.abs(x) > big) & (np.abs(x) < 2 * big))]
    from onemodel.onnx.backend import OneModelBackend

    # onnxruntime's Python API has no numpy type for these: both runtimes widen exactly to
    # float32 inside the model, and the float32 bits are compared (signed zeros included)
    nodes = [helper.make_node("Cast", ["x"], ["q"], to=TO_ONNX[dt], **attrs),
             helper.make_node("Cast", ["q"], ["y"], to=TensorProto.FLOAT)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, [len(x)])],
                          [helper.make_tensor_value_info("y", 1, [len(x)])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = s.run(None, {"x": x})[0]
    ours = OneModelBackend.run_model(m, [x])[0]
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(ours), nan)
    assert np.array_equal(ours[~nan].view(np.uint32), ref[~nan].view(np.uint32))


def test_integer_to_int4_keeps_the_low_bits():
    x = np.array([200, -56, 7, 8, -9, 31], np.int16)
    assert _cast(x, DType.I4).astype(np.int8).tolist() == [-8, -8, 7, -8, 7, -1]
    assert _cast(x, DType.U4).astype(np.int8).tolist() == [8, 8, 7, 8, 7, 15]


def test_e8m0_rounding_modes():
    x = np.array([1.0, 1.5, 3.0, 0.3, 6.0, np.inf, np.nan], np.float32)
    up = _cast(x, DType.F8E8M0FNU, round_mode="up").astype(np.float32)
    down = _cast(x, DType.F8E8M0FNU, round_mode="down").astype(np.float32)
    near = _cast(x, DType.F8E8M0FNU, round_mode="nearest").astype(np.float32)
    assert up[:5].tolist() == [1, 2, 4, 0.5, 8] and down[:5].tolist() == [1, 1, 2, 0.25, 4]
    assert near[:5].tolist() == [1, 2, 4, 0.25, 8]
    assert up[5] == 2.0 ** 127 and np.isnan(up[6])  # saturate: Inf -> the largest scale
    assert np.isnan(_cast(x[5:6], DType.F8E8M0FNU, saturate=0).astype(np.float32)).all()
    with pytest.raises(OneModelError, match="round_mode"):
        _cast(x, DType.F8E8M0FNU, round_mode="odd")


# files -----------------------------------------------------------------------------------------

def _graph():
    from onemodel.runtime import GraphBuilder

    b = GraphBuilder("lowp")
    x = b.input("x", DType.F32, ("batch", 4))
    w = b.initializer("w", np.linspace(-2, 2, 12, dtype=np.float32).reshape(4, 3)
                      .astype(ml_dtypes.bfloat16))
    q = b.initializer("q", np.array([-8, -3, 0, 5, 7], ml_dtypes.int4))
    y = b.op("MatMul", x, b.op("Cast", w, to=DType.F32))
    b.output(y, "y")
    d = b.op("DequantizeLinear", q, b.const(np.float32(0.5)))
    b.output(d, "d")
    return b.build()


@pytest.mark.parametrize("suffix", [".onemodel", ".onnx"])
def test_low_precision_initializers_survive_save_and_load(tmp_path, suffix):
    """A bf16 weight and an int4 constant (packed two to a byte in the ONNX file)."""
    if suffix == ".onnx":
        pytest.importorskip("onemodel.onnx")
    from onemodel.runtime import Session, load, save

    g = _graph()
    path = tmp_path / f"m{suffix}"
    save(g, path)
    back = load(path)
    for name in ("w", "q"):
        assert back.initializers[name].dtype == g.initializers[name].dtype
        assert np.array_equal(_bits(back.initializers[name]), _bits(g.initializers[name]))
    x = np.random.default_rng(3).standard_normal((2, 4)).astype(np.float32)
    out = Session.load(path).run({"x": x})
    want = x @ g.initializers["w"].astype(np.float32)
    np.testing.assert_allclose(out["y"].numpy(), want, rtol=1e-6)
    assert out["d"].numpy().tolist() == [-4.0, -1.5, 0.0, 2.5, 3.5]


# quantization ops against onnxruntime ----------------------------------------------------------

def _ort_and_ours(nodes, inputs: dict, outputs: list, opset: int = 21, inits=()):
    """Run one model on onnxruntime and on OneModel; ``outputs`` are (name, ONNX type)."""
    ort = pytest.importorskip("onnxruntime")
    from onnx import helper, numpy_helper

    from onemodel.onnx.backend import OneModelBackend

    nodes = nodes if isinstance(nodes, list) else [nodes]
    vi = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
          for k, v in inputs.items()]
    outs = [helper.make_tensor_value_info(n, t, None) for n, t in outputs]
    g = helper.make_graph(nodes, "q", vi, outs,
                          [numpy_helper.from_array(v, k) for k, v in inits])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)],
                          ir_version=10 if opset >= 21 else 8)
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = s.run(None, inputs)
    ours = OneModelBackend.run_model(m, list(inputs.values()))
    return ref, ours


def _same(ref, ours):
    for r, o in zip(ref, ours):
        r, o = np.asarray(r), np.asarray(o)
        assert r.dtype == o.dtype and r.shape == o.shape
        if r.dtype.kind == "f":
            np.testing.assert_allclose(o, r, rtol=1e-6, atol=0)
        else:
            assert np.array_equal(o.astype(np.float32), r.astype(np.float32), equal_nan=True)


RNG = np.random.default_rng(7)


@pytest.mark.parametrize("kind", ["tensor", "axis", "blocked"])
@pytest.mark.parametrize("zp_dtype", [np.uint8, np.int8, np.int16, ml_dtypes.int4,
                                      ml_dtypes.uint4, ml_dtypes.float8_e4m3fn])
def test_quantize_dequantize_like_onnxruntime(kind, zp_dtype):
    from onnx import helper

    x = (RNG.standard_normal((4, 6)) * 40).astype(np.float32)
    x[0, :3] = [2.5, 3.5, -2.5]  # ties go to even
    if kind == "tensor":
        scale, attrs = np.float32(0.7), {}
    elif kind == "axis":
        scale, attrs = np.float32([0.5, 1.0, 2.0, 0.25, 3.0, 0.9]), {"axis": 1}
    else:
        scale, attrs = (np.abs(RNG.standard_normal((4, 2))) + 0.2).astype(np.float32), \
            {"axis": 1, "block_size": 3}
    zp = np.full(scale.shape, 0 if zp_dtype is ml_dtypes.float8_e4m3fn else 1).astype(zp_dtype)
    # quantized values leave the model widened to float32 (exact; onnxruntime's Python API has
    # no numpy type for int4 or float8)
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], **attrs),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"], **attrs),
             helper.make_node("Cast", ["q"], ["qf"], to=1)]
    ref, ours = _ort_and_ours(nodes, {"x": x}, [("qf", 1), ("d", 1)],
                              inits=[("s", scale), ("z", zp)])
    _same(ref, ours)


def test_dynamic_quantize_like_onnxruntime():
    from onnx import helper

    node = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])
    for x in [(RNG.standard_normal((3, 5)) * 4).astype(np.float32),
              np.abs(RNG.standard_normal(7)).astype(np.float32),
              -np.abs(RNG.standard_normal(7)).astype(np.float32)]:
        ref, ours = _ort_and_ours(node, {"x": x}, [("y", 2), ("s", 1), ("z", 2)], opset=11)
        _same(ref, ours)


def test_integer_products_like_onnxruntime():
    from onnx import helper

    a = RNG.integers(0, 256, (2, 3, 5)).astype(np.uint8)
    b = RNG.integers(-128, 128, (5, 4)).astype(np.int8)
    node = helper.make_node("MatMulInteger", ["a", "b", "az", "bz"], ["y"])
    ref, ours = _ort_and_ours(node, {"a": a, "b": b}, [("y", 6)], opset=10,
                              inits=[("az", np.uint8(12)), ("bz", np.int8(-3))])
    _same(ref, ours)
    qa = RNG.integers(0, 256, (3, 5)).astype(np.uint8)
    qb = RNG.integers(0, 256, (5, 4)).astype(np.uint8)
    node = helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"],
                            ["y"])
    ref, ours = _ort_and_ours(node, {"a": qa, "b": qb}, [("y", 2)], opset=10, inits=[
        ("as", np.float32(0.02)), ("az", np.uint8(120)), ("bs", np.float32(0.03)),
        ("bz", np.uint8(130)), ("ys", np.float32(0.05)), ("yz", np.uint8(128))])
    _same(ref, ours)


def test_integer_convolutions_like_onnxruntime():
    from onnx import helper

    x = RNG.integers(0, 256, (1, 2, 6, 6)).astype(np.uint8)
    w = RNG.integers(0, 256, (3, 2, 3, 3)).astype(np.uint8)
    node = helper.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"], pads=[1, 1, 1, 1],
                            strides=[2, 1])
    ref, ours = _ort_and_ours(node, {"x": x, "w": w}, [("y", 6)], opset=10,
                              inits=[("xz", np.uint8(100)), ("wz", np.uint8(110))])
    _same(ref, ours)
    wi = RNG.integers(-127, 128, (3, 2, 3, 3)).astype(np.int8)
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "B"],
                            ["y"], pads=[1, 1, 1, 1])
    ref, ours = _ort_and_ours(node, {"x": x, "w": wi}, [("y", 2)], opset=10, inits=[
        ("xs", np.float32(0.02)), ("xz", np.uint8(120)),
        ("ws", np.float32([0.01, 0.02, 0.015])), ("wz", np.zeros(3, np.int8)),
        ("ys", np.float32(0.1)), ("yz", np.uint8(128)), ("B", np.int32([100, -200, 0]))])
    _same(ref, ours)


def test_quantize_refusals_name_the_op_and_dtype():
    x = np.ones((2, 3), np.float32)
    with pytest.raises(DTypeError, match="QuantizeLinear.*cannot quantize to F32"):
        _run_op("QuantizeLinear", [x, np.float32(1)], output_dtype=DType.F32)
    with pytest.raises(OneModelError, match="QuantizeLinear.*y_scale"):
        _run_op("QuantizeLinear", [x, np.ones(4, np.float32)], axis=1)
    with pytest.raises(DTypeError, match="BitCast.*bit widths"):
        _run_op("BitCast", [x], to=DType.I16)
    assert _run_op("BitCast", [np.float32([1.0])], to=DType.I32).tolist() == [0x3F800000]


def test_bf16_einsum_and_celu_like_torch():
    """Computed in float32 and rounded once, as PyTorch's CPU kernels do."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    a = rng.standard_normal((2, 3, 16)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((2, 16, 4)).astype(ml_dtypes.bfloat16)
    ours = _run_op("Einsum", [a, b], equation="bij,bjk->bik")
    ta, tb = (torch.from_numpy(x.view(np.int16)).view(torch.bfloat16) for x in (a, b))
    ref = torch.einsum("bij,bjk->bik", ta, tb).float().numpy()
    assert ours.dtype == ml_dtypes.bfloat16
    np.testing.assert_allclose(ours.astype(np.float32), ref, rtol=2 ** -7, atol=1e-2)
    x = (rng.standard_normal(200) * 3).astype(ml_dtypes.bfloat16)
    ours = _run_op("Celu", [x], alpha=1.5)
    tx = torch.from_numpy(x.view(np.int16)).view(torch.bfloat16)
    ref = torch.nn.functional.celu(tx, alpha=1.5).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(_bits(ours), ref)


@pytest.mark.parametrize("op,attrs", [("ReduceSum", {}), ("CumSum", None), ("Softmax", {}),
                                      ("Exp", {}), ("Relu", {})])
@pytest.mark.parametrize("dt", [DType.BF16, DType.F8E4M3FN, DType.I4])
def test_ops_without_low_precision_kernels_refuse_them(op, attrs, dt):
    """No silent arithmetic in a type too narrow to accumulate in: a DTypeError naming both."""
    x = np.arange(6).reshape(2, 3).astype(np.float32).astype(dt.numpy)
    args = [x, np.int64(0)] if attrs is None else [x]
    with pytest.raises(DTypeError, match=f"{op}.*{dt.name}"):
        _run_op(op, args, **(attrs or {}))
