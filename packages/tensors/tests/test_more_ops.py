"""Ops added for ONNX coverage (Size, Tile, CumProd, Det, norms, pools, signal ops...) against
PyTorch where it has them, and their shape rules on symbolic dims. The ONNX backend node tests
(integration-tests/onnx) check each against ONNX's expected outputs as well."""

from __future__ import annotations

import numpy as np
import pytest

from onemodel.tensors import DimExpr, DType, Tensor
from onemodel.tensors.dispatch import dispatch
from onemodel.tensors.errors import ShapeError
from onemodel.tensors.ops import OPS, TensorSpec

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(0)
N, L = DimExpr.symbol("n"), DimExpr.symbol("l")


def run(op, *inputs, **attrs):
    """Call op eagerly; numpy arrays become Tensors, None stays an omitted input."""
    ts = [None if x is None else x if isinstance(x, Tensor) else Tensor.from_numpy(np.asarray(x))
          for x in inputs]
    out = dispatch(op, ts, attrs)
    return out


def ints(values):
    return np.asarray(values, np.int64)


# Size, Tile -------------------------------------------------------------------------------------

def test_size_value_is_known_from_a_symbolic_shape():
    (spec,) = OPS["Size"].infer([TensorSpec((N, 3, L), DType.F32)])
    assert spec.shape == () and spec.dtype is DType.I64
    assert spec.value == (N * 3 * L,)
    assert run("Size", np.zeros((2, 3, 4), np.float32)).numpy().item() == 24


def test_tile_matches_torch_and_its_gradient():
    x = RNG.standard_normal((2, 3))
    t = Tensor.from_numpy(x).requires_grad_()
    y = run("Tile", t, ints([2, 3]))
    tx = torch.tensor(x, requires_grad=True)
    ref = tx.tile((2, 3))
    np.testing.assert_array_equal(y.numpy(), ref.detach().numpy())
    up = RNG.standard_normal(ref.shape)
    y.backward(Tensor.from_numpy(up))
    ref.backward(torch.tensor(up))
    np.testing.assert_allclose(t.grad.numpy(), tx.grad.numpy(), rtol=1e-12)


def test_tile_shape_rule_on_symbolic_dims_and_values():
    reps = TensorSpec((2,), DType.I64, (3, 2))
    (spec,) = OPS["Tile"].infer([TensorSpec((N, 4), DType.F32), reps])
    assert spec.shape == (N * 3, 8)
    # a shape tensor tiled keeps its (symbolic) value
    (spec,) = OPS["Tile"].infer([TensorSpec((2,), DType.I64, (N, 5)),
                                 TensorSpec((1,), DType.I64, (2,))])
    assert spec.value == (N, 5, N, 5)
    with pytest.raises(ShapeError, match="one entry per axis"):
        OPS["Tile"].infer([TensorSpec((N, 4), DType.F32), TensorSpec((1,), DType.I64, (2,))])


# CumProd, Det -----------------------------------------------------------------------------------

@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumprod_forward_and_gradient_match_torch(exclusive, reverse):
    x = RNG.standard_normal((3, 5))
    x[1, 2] = 0.0  # the gradient must not divide by x
    x[2, 1] = x[2, 3] = 0.0
    t = Tensor.from_numpy(x).requires_grad_()
    y = run("CumProd", t, ints(1), exclusive=exclusive, reverse=reverse)
    tx = torch.tensor(x, requires_grad=True)
    v = tx.flip(1) if reverse else tx
    if exclusive:
        v = torch.cat([torch.ones_like(v[:, :1]), v[:, :-1]], dim=1)
    ref = torch.cumprod(v, dim=1)
    ref = ref.flip(1) if reverse else ref
    np.testing.assert_allclose(y.numpy(), ref.detach().numpy(), rtol=1e-12)
    up = RNG.standard_normal(ref.shape)
    y.backward(Tensor.from_numpy(up))
    ref.backward(torch.tensor(up))
    np.testing.assert_allclose(t.grad.numpy(), tx.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_det_matches_torch():
    x = RNG.standard_normal((2, 3, 4, 4))
    np.testing.assert_allclose(run("Det", x).numpy(), torch.linalg.det(torch.tensor(x)).numpy(),
                               rtol=1e-10)
    (spec,) = OPS["Det"].infer([TensorSpec((N, 3, 3), DType.F32)])
    assert spec.shape == (N,)
    with pytest.raises(ShapeError, match="square"):
        OPS["Det"].infer([TensorSpec((2, 3), DType.F32)])


# normalization and pooling ----------------------------------------------------------------------

def _grad_check(ours_fn, theirs_fn, arrays, rtol=1e-9, atol=1e-10):
    """Forward and backward of ours against torch for float64 inputs (all differentiable)."""
    ts = [Tensor.from_numpy(a).requires_grad_() for a in arrays]
    tt = [torch.tensor(a, requires_grad=True) for a in arrays]
    y, ref = ours_fn(*ts), theirs_fn(*tt)
    np.testing.assert_allclose(y.numpy(), ref.detach().numpy(), rtol=rtol, atol=atol)
    up = RNG.standard_normal(ref.shape)
    y.backward(Tensor.from_numpy(up))
    ref.backward(torch.tensor(up))
    for t, r in zip(ts, tt):
        np.testing.assert_allclose(t.grad.numpy(), r.grad.numpy(), rtol=1e-7, atol=1e-9)


def test_group_and_instance_normalization_match_torch():
    x, s, b = RNG.standard_normal((2, 6, 3, 4)), RNG.standard_normal(6), RNG.standard_normal(6)
    _grad_check(lambda x, s, b: run("GroupNormalization", x, s, b, num_groups=3, epsilon=1e-3),
                lambda x, s, b: torch.nn.functional.group_norm(x, 3, s, b, eps=1e-3), [x, s, b])
    _grad_check(lambda x, s, b: run("InstanceNormalization", x, s, b),
                lambda x, s, b: torch.nn.functional.instance_norm(x, weight=s, bias=b, eps=1e-5),
                [x, s, b])
    with pytest.raises(ShapeError, match="groups"):
        OPS["GroupNormalization"].infer([TensorSpec((N, 6, 4), DType.F32),
                                         TensorSpec((6,), DType.F32),
                                         TensorSpec((6,), DType.F32)], {"num_groups": 4})


@pytest.mark.parametrize("p", [1, 2])
def test_lp_normalization_matches_torch(p):
    x = RNG.standard_normal((3, 4, 5))
    x[1, :, 2] = 0.0  # a zero norm gives 0, not nan
    ours = run("LpNormalization", x, axis=1, p=p).numpy()
    ref = x / np.maximum(np.linalg.norm(x, ord=p, axis=1, keepdims=True), 1e-300)
    np.testing.assert_allclose(ours, ref, rtol=1e-12)
    x[1, :, 2] = RNG.standard_normal(4)
    _grad_check(lambda t: run("LpNormalization", t, axis=1, p=p),
                lambda t: torch.nn.functional.normalize(t, p=p, dim=1, eps=0.0), [x])


def test_mean_variance_normalization_and_its_gradient():
    x = RNG.standard_normal((2, 3, 4, 5))

    def theirs(t):
        c = t - t.mean(dim=(0, 2, 3), keepdim=True)
        return c / ((c * c).mean(dim=(0, 2, 3), keepdim=True).sqrt() + 1e-9)

    _grad_check(lambda t: run("MeanVarianceNormalization", t), theirs, [x])


def test_lp_pool_matches_torch():
    x = RNG.standard_normal((2, 3, 7, 6))
    for p in (1, 2, 3):
        ours = run("LpPool", x, kernel_shape=(3, 2), strides=(2, 2), p=p).numpy()
        ref = torch.nn.functional.lp_pool2d(torch.tensor(np.abs(x)), p, (3, 2), stride=(2, 2))
        np.testing.assert_allclose(ours, ref.numpy(), rtol=1e-10)
    # gradient: torch's lp_pool2d is (sum x^p)^(1/p), so |x| for odd p (x > 0 there)
    for p in (1, 2, 3):
        _grad_check(lambda t, p=p: run("LpPool", t, kernel_shape=(3, 2), strides=(2, 1),
                                       pads=(1, 0, 1, 0), p=p),
                    lambda t, p=p: torch.nn.functional.lp_pool2d(
                        torch.nn.functional.pad(t, (0, 0, 1, 1)), p, (3, 2), stride=(2, 1)),
                    [np.abs(x) + 0.1])
    (spec,) = OPS["LpPool"].infer([TensorSpec((N, 3, L, 8), DType.F32)],
                                  {"kernel_shape": (2, 2), "strides": (2, 2)})
    assert spec.shape[:2] == (N, 3) and spec.shape[3] == 4


def test_max_unpool_inverts_torch_max_pool():
    x = torch.tensor(RNG.standard_normal((2, 3, 6, 8)))
    y, idx = torch.nn.functional.max_pool2d(x, 2, 2, return_indices=True)
    ref = torch.nn.functional.max_unpool2d(y, idx, 2, 2)
    # torch's indices are per (N, C) plane, ONNX's over the whole tensor
    plane = 6 * 8
    flat = idx.numpy() + (np.arange(6) * plane).reshape(2, 3, 1, 1)
    ours = run("MaxUnpool", y.numpy(), flat, kernel_shape=(2, 2), strides=(2, 2))
    np.testing.assert_array_equal(ours.numpy(), ref.numpy())


def test_eye_like_and_reverse_sequence():
    np.testing.assert_array_equal(run("EyeLike", np.zeros((3, 5), np.float32), k=1,
                                      dtype=DType.I32).numpy(),
                                  torch.eye(3, 5, dtype=torch.int32).roll(1, 1).numpy()
                                  * (np.arange(5) > 0))
    x = RNG.standard_normal((4, 3, 2))  # (time, batch, feature)
    lens = ints([4, 1, 2])
    got = run("ReverseSequence", x, lens).numpy()
    for b, n in enumerate(lens):
        np.testing.assert_array_equal(got[:n, b], x[:n, b][::-1])
        np.testing.assert_array_equal(got[n:, b], x[n:, b])
    with pytest.raises(ShapeError, match="lengths"):
        run("ReverseSequence", x, ints([5, 1, 1]))


# signal ops -------------------------------------------------------------------------------------

def _pairs(z):
    return np.stack([z.real, z.imag], axis=-1)


def test_dft_forms_match_torch_fft():
    x = RNG.standard_normal((2, 8, 3))
    real = x[..., :1]  # [.., 1]: a real signal; DFT over axis 1
    z = x[..., 0] + 1j * x[..., 1]
    cplx = _pairs(z)
    tz = torch.tensor(z)
    axis1 = ints(1)
    np.testing.assert_allclose(run("DFT", real, None, axis1).numpy(),
                               _pairs(torch.fft.fft(torch.tensor(x[..., 0]), dim=1).numpy()),
                               atol=1e-12)
    np.testing.assert_allclose(run("DFT", cplx, ints(5), axis1).numpy(),
                               _pairs(torch.fft.fft(tz, n=5, dim=1).numpy()), atol=1e-12)
    np.testing.assert_allclose(run("DFT", real, ints(12), axis1, onesided=1).numpy(),
                               _pairs(torch.fft.rfft(torch.tensor(x[..., 0]), n=12,
                                                     dim=1).numpy()), atol=1e-12)
    np.testing.assert_allclose(run("DFT", cplx, None, axis1, inverse=1).numpy(),
                               _pairs(torch.fft.ifft(tz, dim=1).numpy()), atol=1e-12)
    half = _pairs(torch.fft.rfft(torch.tensor(x[..., 0]), dim=1).numpy())  # (2, 5, 3, 2)
    np.testing.assert_allclose(run("DFT", half, None, axis1, inverse=1, onesided=1).numpy(),
                               x[..., :1], atol=1e-12)  # IRFFT of the RFFT: the signal back


def test_dft_and_stft_shape_rules_on_symbolic_dims():
    (spec,) = OPS["DFT"].infer([TensorSpec((N, L, 1), DType.F32), None,
                                TensorSpec((), DType.I64, (1,))], {"onesided": 1})
    assert spec.shape == (N, L // 2 + 1, 2)
    (spec,) = OPS["DFT"].infer([TensorSpec((N, L, 2), DType.F32)], {"inverse": 1, "onesided": 1})
    assert spec.shape == (N, (L + -1) * 2, 1)
    (spec,) = OPS["STFT"].infer([TensorSpec((N, L, 1), DType.F32),
                                 TensorSpec((), DType.I64, (4,)), TensorSpec((16,), DType.F32)])
    assert spec.shape == (N, (L + -16) // 4 + 1, 9, 2)
    with pytest.raises(ShapeError, match="axis"):
        OPS["DFT"].infer([TensorSpec((N, L, 1), DType.F32), None,
                          TensorSpec((), DType.I64, (2,))])


@pytest.mark.parametrize("onesided", [0, 1])
def test_stft_matches_torch(onesided):
    x = RNG.standard_normal((2, 64))
    window = torch.hann_window(16, dtype=torch.float64)
    ours = run("STFT", x[..., None], ints(4), window.numpy(), ints(16), onesided=onesided)
    ref = torch.stft(torch.tensor(x), 16, hop_length=4, window=window, center=False,
                     onesided=bool(onesided), return_complex=True)  # (batch, bins, frames)
    np.testing.assert_allclose(ours.numpy(), _pairs(ref.transpose(1, 2).numpy()), atol=1e-12)


@pytest.mark.parametrize("periodic", [0, 1])
def test_windows_match_torch(periodic):
    def hamming(n, **kw):  # ONNX's coefficients: 25/46 and 21/46, not torch's 0.54/0.46
        return torch.hamming_window(n, alpha=25 / 46, beta=21 / 46, **kw)

    for op, fn in (("HannWindow", torch.hann_window), ("HammingWindow", hamming),
                   ("BlackmanWindow", torch.blackman_window)):
        ours = run(op, ints(10), periodic=periodic, output_datatype=DType.F64).numpy()
        ref = fn(10, periodic=bool(periodic), dtype=torch.float64).numpy()
        np.testing.assert_allclose(ours, ref, atol=1e-12, err_msg=op)


def test_mel_weight_matrix_triangles():
    w = run("MelWeightMatrix", ints(8), ints(64), ints(8000), np.float32(0.0),
            np.float32(4000.0)).numpy()
    assert w.shape == (33, 8) and w.dtype == np.float32
    # each filter is a triangle that peaks at 1 and its neighbours overlap it
    assert np.allclose(w.max(axis=0), 1.0)
    peaks = w.argmax(axis=0)
    assert (np.diff(peaks) > 0).all()


# DeformConv, RoiAlign (torchvision is not a test dependency: checked against torch's conv and
# against exact cases; ONNX's expected outputs cover the general case) -----------------------

def test_deform_conv_with_zero_and_integer_offsets_is_torch_conv():
    x = RNG.standard_normal((2, 4, 6, 7))
    w = RNG.standard_normal((6, 2, 3, 3))
    b = RNG.standard_normal(6)
    attrs = dict(group=2, offset_group=2, pads=(1, 1, 1, 1), strides=(2, 1))
    ref = torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(w), torch.tensor(b),
                                     stride=(2, 1), padding=1, groups=2).numpy()
    off = np.zeros((2, 2 * 9 * 2) + ref.shape[2:])
    np.testing.assert_allclose(run("DeformConv", x, w, off, b, **attrs).numpy(), ref,
                               rtol=1e-10, atol=1e-12)
    # every tap moved one column right (no padding): the conv of the input shifted left,
    # zero filled, and a mask of 1/2 halves it
    attrs["pads"] = (0, 0, 0, 0)
    shifted = np.concatenate([x[..., 1:], np.zeros_like(x[..., :1])], axis=-1)
    ref = torch.nn.functional.conv2d(torch.tensor(shifted), torch.tensor(w), None,
                                     stride=(2, 1), groups=2).numpy()
    off = np.zeros((2, 2 * 9 * 2) + ref.shape[2:])
    off.reshape(2, 2, 9, 2, *ref.shape[2:])[:, :, :, 1] = 1.0
    mask = np.full((2, 2 * 9) + ref.shape[2:], 0.5)
    np.testing.assert_allclose(run("DeformConv", x, w, off, None, mask, **attrs).numpy(),
                               ref / 2, rtol=1e-10, atol=1e-12)
    (spec,) = OPS["DeformConv"].infer([TensorSpec((N, 4, L, 7), DType.F32),
                                       TensorSpec((6, 2, 3, 3), DType.F32),
                                       TensorSpec((N, 36, L, 7), DType.F32)],
                                      {"group": 2, "offset_group": 2, "pads": (1, 1, 1, 1)})
    assert spec.shape == (N, 6, L, 7)


@pytest.mark.parametrize("mode", ["avg", "max"])
def test_roi_align_at_pixel_centres_reads_the_map(mode):
    x = RNG.uniform(0.5, 2.0, (2, 3, 5, 6))
    rois = np.asarray([[0, 0, 6, 5], [2, 1, 4, 3]], np.float64)
    y = run("RoiAlign", x, rois, ints([1, 0]), output_height=5, output_width=6,
            sampling_ratio=1, mode=mode).numpy()
    np.testing.assert_allclose(y[0], x[1], rtol=1e-12)  # one sample per pixel centre
    # a 2x2 region in 2x2 bins, 2x2 samples per bin: the samples sit 1/4 pixel either side of
    # a pixel centre, so per axis the bin weighs that pixel 3/4 and each neighbour 1/8
    z = run("RoiAlign", x, rois[1:], ints([0]), output_height=2, output_width=2,
            sampling_ratio=2, mode=mode).numpy()
    assert z.shape == (1, 3, 2, 2)
    if mode == "avg":
        samples = []
        for ph in range(2):
            for pw in range(2):
                cy, cx = 1 + ph, 2 + pw  # the pixel whose centre the bin covers
                vals = [x[0, :, cy + dy, cx + dx] * wy * wx
                        for dy, wy in ((-1, 1 / 8), (0, 3 / 4), (1, 1 / 8))
                        for dx, wx in ((-1, 1 / 8), (0, 3 / 4), (1, 1 / 8))]
                samples.append(sum(vals))
        np.testing.assert_allclose(z[0].transpose(1, 2, 0).reshape(4, 3), np.stack(samples),
                                   rtol=1e-12)
    with pytest.raises(ShapeError, match="batch_indices"):
        run("RoiAlign", x, rois, ints([0, 2]))


# reductions over an empty axis ------------------------------------------------------------------

def test_reductions_over_an_empty_axis():
    x = np.zeros((3, 0), np.float32)
    # ONNX (opset 18): the identity of max / min
    np.testing.assert_array_equal(run("ReduceMax", x, ints([1]), keepdims=0).numpy(),
                                  np.full(3, -np.inf, np.float32))
    np.testing.assert_array_equal(run("ReduceMin", x.astype(np.int32), ints([1])).numpy(),
                                  np.full((3, 1), np.iinfo(np.int32).max))
    # an index has no identity: refused, unless the result is empty too
    with pytest.raises(ShapeError, match="ArgMax over axis 1 of size 0"):
        run("ArgMax", x, axis=1)
    assert run("ArgMin", x, axis=0, keepdims=0).numpy().shape == (0,)
    assert run("ArgMax", np.zeros((0, 0)), axis=1).numpy().shape == (0, 1)


def test_max_pool_indices_match_torch():
    x = RNG.standard_normal((2, 3, 7, 6))
    x[0, 0, :2, :2] = 5.0  # ties: the first in the window
    y, idx = run("MaxPoolWithIndices", x, kernel_shape=(3, 2), strides=(2, 2),
                 pads=(1, 0, 1, 0))
    ry, ri = torch.nn.functional.max_pool2d(torch.tensor(x), (3, 2), (2, 2), padding=(1, 0),
                                            return_indices=True)
    np.testing.assert_array_equal(y.numpy(), ry.numpy())
    plane = (np.arange(6) * 42).reshape(2, 3, 1, 1)  # ONNX: flat over N and C too
    np.testing.assert_array_equal(idx.numpy(), ri.numpy() + plane)
    np.testing.assert_array_equal(y.numpy(), run("MaxPool", x, kernel_shape=(3, 2),
                                                 strides=(2, 2), pads=(1, 0, 1, 0)).numpy())
    # storage_order 1: column-major over the spatial axes
    _, col = run("MaxPoolWithIndices", x, kernel_shape=(3, 2), strides=(2, 2),
                 pads=(1, 0, 1, 0), storage_order=1)
    r, c = np.divmod(ri.numpy(), 6)
    np.testing.assert_array_equal(col.numpy(), r + c * 7 + plane)


def test_conv_output_channels_the_group_cannot_split_are_a_shape_error():
    """PyTorch refuses such weights too; ours says which count and group, never numpy's
    reshape error from inside the kernel."""
    import numpy as np
    import pytest

    from onemodel.tensors import ShapeError, Tensor
    from onemodel.tensors.ops._grad import call

    x = Tensor.from_numpy(np.zeros((1, 4, 5, 5), np.float32))
    w = Tensor.from_numpy(np.zeros((5, 2, 3, 3), np.float32))
    with pytest.raises(ShapeError, match="5 output channels, which group 2"):
        call("Conv", x, w, group=2)
