"""FusedMatMul (a transformer's MatMul, bias Add and activation as one node): the MatMul's
planned product (the packed panels for a file's float32 weights, the reference's product
else), then the bias and activation in one pass over it, against the reference FusedMatMul
(the ops one by one) and PyTorch's Linear and GELU; calls outside the plan take the generic
call."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
from conv_arrays import file_constant

from onemodel.numba import gemm
from onemodel.numba._simd import host_has_fma
from onemodel.tensors.ops import OPS
from onemodel.tensors.ops.specialize import CallSite, specialize

pytestmark = pytest.mark.usefixtures("serial")  # the panels are planned on one thread only

ACTIVATIONS = ["", "Relu", "Sigmoid", "Tanh", "HardSwish", "Relu6", "Silu", "Gelu"]


def _arrays(a_shape, n, dtype, seed=0):
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal(a_shape) * 2).astype(dtype)
    w = (rng.standard_normal((a_shape[-1], n)) / np.sqrt(a_shape[-1])).astype(dtype)
    c = rng.standard_normal(n).astype(dtype)
    return a, w, c


def _planned(a, w, c, activation):
    attrs = {"activation": activation}
    generic = partial(gemm.fused_matmul, **attrs)
    inputs = (a, w) if c is None else (a, w, c)
    with np.errstate(all="ignore"):
        want = generic(*inputs)
    site = CallSite(tuple(x.shape for x in inputs), tuple(x.dtype for x in inputs),
                    (None, *inputs[1:]), attrs, (want.shape,), generic)
    return specialize(gemm.fused_matmul, site), inputs


def _close(got, want, tol):
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = np.isfinite(want)
    np.testing.assert_array_equal(got[~finite & ~np.isnan(want)], want[~finite & ~np.isnan(want)])
    scale = max(1.0, float(np.abs(want[finite]).max(initial=0.0)))
    assert float(np.abs(got[finite] - want[finite]).max(initial=0.0)) <= tol * scale


@pytest.mark.parametrize("a_shape, n", [((2, 5, 32), 64), ((2, 17, 16), 48), ((1, 3, 40), 24),
                                        ((4, 8), 16), ((2, 2, 3, 24), 40)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_planned_calls_agree_with_the_reference(a_shape, n, dtype, activation):
    a, w, c = _arrays(a_shape, n, dtype, seed=n)
    a.flat[3] = np.nan
    a.flat[-1] = np.inf
    w, c = file_constant(w), file_constant(c)
    tol = 2e-6 if dtype == np.float32 else 1e-12
    for bias in (c, None):
        call, inputs = _planned(a, w, bias, activation)
        # a bias alone on float32 panels: the sums start from it (panels.product)
        biased = activation == "" and bias is not None and dtype == np.float32 and \
            host_has_fma()
        assert call.__name__ == ("biased_matmul_at" if biased else "fused_matmul_at")
        with np.errstate(all="ignore"):
            want = OPS["FusedMatMul"].kernel(*inputs, activation=activation)
            out = np.empty_like(want)
            assert call(*inputs, out=out) is out
            _close(out, want, tol)
            _close(call(*inputs), want, tol)
            # eager: the same
            _close(gemm.fused_matmul(*inputs, activation=activation), want, tol)


def test_gelu_is_torch_gelu():
    torch = pytest.importorskip("torch")
    a, w, c = _arrays((2, 7, 32), 64, np.float32, seed=5)
    call, inputs = _planned(a, file_constant(w), file_constant(c), "Gelu")
    want = torch.nn.functional.gelu(torch.from_numpy(a) @ torch.from_numpy(w) +
                                    torch.from_numpy(c)).numpy()
    np.testing.assert_allclose(call(*inputs), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("activation", ["Gelu", ""])  # "": the bias in the panels' sums
def test_other_calls_take_the_generic_call(activation):
    a, w, c = _arrays((2, 5, 32), 64, np.float32, seed=2)
    w, c = file_constant(w), file_constant(c)
    call, _ = _planned(a, w, c, activation)
    want = OPS["FusedMatMul"].kernel(a, w, c, activation=activation)
    other_bias = c * 2
    _close(call(a, w, other_bias), OPS["FusedMatMul"].kernel(a, w, other_bias,
                                                              activation=activation), 2e-6)
    _close(call(a, w), OPS["FusedMatMul"].kernel(a, w, activation=activation), 2e-6)
    longer = np.concatenate([a, a], axis=1)
    _close(call(longer, w, c), OPS["FusedMatMul"].kernel(longer, w, c, activation=activation),
           2e-6)
    strided = np.repeat(a, 2, axis=2)[..., ::2]
    _close(call(strided, w, c), want, 2e-6)
    other_w = w * 0.5
    _close(call(a, other_w, c), OPS["FusedMatMul"].kernel(a, other_w, c,
                                                          activation=activation), 2e-6)
    strided_out = np.empty((2, 5, 128), np.float32)[..., ::2]
    call(a, w, c, out=strided_out)
    _close(strided_out, want, 2e-6)


def test_a_bias_the_caller_can_change_is_added_after_the_product():
    """A writable bias (a caller's array, not a file's constant) is not copied into the
    panels' starting sums: changed in place, the next call adds the new values."""
    a, w, c = _arrays((2, 5, 32), 64, np.float32, seed=3)
    w = file_constant(w)
    call, _ = _planned(a, w, c, "")
    assert call.__name__ == "fused_matmul_at"
    c += 1.0
    _close(call(a, w, c), OPS["FusedMatMul"].kernel(a, w, c), 2e-6)


def test_the_op_refuses_a_bias_that_is_not_a_row_of_the_columns():
    from onemodel.tensors import DType
    from onemodel.tensors.errors import ShapeError
    from onemodel.tensors.ops.base import TensorSpec

    rule = OPS["FusedMatMul"].shape_rule
    a, b = TensorSpec((2, 5, 8), DType.F32), TensorSpec((8, 4), DType.F32)
    assert rule([a, b, TensorSpec((4,), DType.F32)], activation="Gelu").shape == (2, 5, 4)
    with pytest.raises(ShapeError, match="bias"):
        rule([a, b, TensorSpec((5, 4), DType.F32)])
    with pytest.raises(ShapeError, match="activation"):
        rule([a, b, None], activation="Softplus")
