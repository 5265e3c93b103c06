"""ChannelLayerNormalization's planned call (norm._layer_norm_channels over whole channel
planes) against the reference op, and the calls outside its plan (another scale, a strided
input or output, another shape) taking the generic call."""

from __future__ import annotations

import numpy as np
import pytest
from conv_arrays import file_constant

from onemodel.numba import norm
from onemodel.tensors.ops import OPS
from onemodel.tensors.ops.specialize import CallSite, specialize

pytestmark = pytest.mark.usefixtures("serial")
REFERENCE = OPS["ChannelLayerNormalization"].kernel


def _planned(x, scale, bias, epsilon=1e-5):
    inputs = (x, scale) if bias is None else (x, scale, bias)
    site = CallSite(tuple(a.shape for a in inputs), tuple(a.dtype for a in inputs),
                    (None, *inputs[1:]), {"epsilon": epsilon}, (x.shape,),
                    lambda X, S, B=None, out=None: norm.channel_layer_normalization(
                        X, S, B, epsilon=epsilon, out=out))
    return specialize(norm.channel_layer_normalization, site), inputs


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(2, 8, 8, 8), (1, 96, 16, 16), (3, 5, 7), (2, 3, 2, 3, 4)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_planned_calls_match_the_reference(shape, dtype, with_bias):
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 3 + 1).astype(dtype)
    x.reshape(shape[0], shape[1], -1)[0, :, 0] = np.nan  # one pixel: NaN in all its channels
    x.reshape(shape[0], shape[1], -1)[-1, 1, -1] = np.inf
    scale = file_constant(rng.standard_normal(shape[1]).astype(dtype))
    bias = file_constant(rng.standard_normal(shape[1]).astype(dtype)) if with_bias else None
    call, inputs = _planned(x, scale, bias, 1e-4)
    assert call.__name__ == "channel_layer_normalization_at"
    with np.errstate(invalid="ignore"):
        want = REFERENCE(*inputs, epsilon=1e-4)
        tol = dict(rtol=2e-5, atol=2e-5) if dtype == np.float32 else dict(rtol=1e-11, atol=1e-11)
        out = np.full(shape, 7.0, dtype)
        assert call(*inputs, out=out) is out
        np.testing.assert_allclose(out, want, **tol)
        np.testing.assert_allclose(call(*inputs), want, **tol)


def test_calls_outside_the_plan_take_the_generic_call():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 8, 5, 5)).astype(np.float32)
    scale = file_constant(rng.standard_normal(8).astype(np.float32))
    bias = file_constant(rng.standard_normal(8).astype(np.float32))
    call, _ = _planned(x, scale, bias)
    other = scale * 2
    np.testing.assert_allclose(call(x, other, bias), REFERENCE(x, other, bias), rtol=2e-5,
                               atol=2e-5)
    np.testing.assert_allclose(call(x, scale), REFERENCE(x, scale), rtol=2e-5, atol=2e-5)
    strided = np.repeat(x, 2, axis=3)[..., ::2]
    np.testing.assert_allclose(call(strided, scale, bias), REFERENCE(x, scale, bias),
                               rtol=2e-5, atol=2e-5)
    bigger = rng.standard_normal((2, 8, 6, 5)).astype(np.float32)
    np.testing.assert_allclose(call(bigger, scale, bias), REFERENCE(bigger, scale, bias),
                               rtol=2e-5, atol=2e-5)
    strided_out = np.empty((2, 8, 5, 10), np.float32)[..., ::2]
    call(x, scale, bias, out=strided_out)
    np.testing.assert_allclose(strided_out, REFERENCE(x, scale, bias), rtol=2e-5, atol=2e-5)


def test_a_scale_given_at_run_time_is_not_planned():
    x = np.ones((1, 4, 3, 3), np.float32)
    site = CallSite((x.shape, (4,)), (x.dtype, x.dtype), (None, None), {}, (x.shape,),
                    norm.channel_layer_normalization)
    assert specialize(norm.channel_layer_normalization, site) is None
