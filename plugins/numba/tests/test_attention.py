"""The numba FusedAttention kernel against the op's reference kernel (the unfused ops in turn)
and PyTorch's scaled_dot_product_attention: the three paths (float32 register tiles, one
pass per query row, BLAS products), strided views as exported graphs hand them over,
broadcast masks, float32 and float64, blocked and NaN rows."""

from __future__ import annotations

import numpy as np
import pytest

from onemodel.numba import attention
from onemodel.numba.support import attention as supports
from onemodel.tensors.ops import OPS

REFERENCE = OPS["FusedAttention"].kernel
RNG = np.random.default_rng(11)


def _heads(b, s, h, d, dtype, layout):
    """(b, h, s, d) as a transposed view of (b, s, h, d), as a head split leaves it."""
    x = RNG.standard_normal((b, s, h, d)).astype(dtype)
    return x.transpose(0, 2, 1, 3) if layout == "view" else np.ascontiguousarray(
        x.transpose(0, 2, 1, 3))


def _tol(dtype):
    return dict(rtol=2e-5, atol=2e-6) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
# float32: 5, 9 and 17 the lanes (17 by 20: V's rows end inside a vector), 33 BLAS products;
# float64: 5 one pass per row, the others BLAS (test_each_shape_takes_its_path)
@pytest.mark.parametrize("seq,head", [(5, 8), (9, 16), (17, 20), (33, 16)])
@pytest.mark.parametrize("layout", ["view", "contiguous"])
@pytest.mark.parametrize("mask_shape", [None, (2, 1, 1, "s"), ("s", "s"), (1, 3, "s", "s"),
                                        (2, 3, "s", 1)])
def test_equals_reference_and_torch(dtype, seq, head, layout, mask_shape):
    import torch

    q = _heads(2, seq, 3, head, dtype, layout)
    k = _heads(2, seq, 3, head, dtype, layout)
    v = _heads(2, seq, 3, head, dtype, layout)
    kt = k.transpose(0, 1, 3, 2)
    mask = None
    if mask_shape is not None:
        shape = tuple(seq if d == "s" else d for d in mask_shape)
        mask = RNG.standard_normal(shape).astype(dtype)
        if shape[-1] > 1:
            mask[..., 0] = -np.inf  # a key nobody may attend
    assert supports(q, kt, v, mask, scale=0.3)
    got = attention.fused_attention(q, kt, v, mask, scale=0.3)
    want = REFERENCE(q, kt, v, mask, scale=0.3)
    np.testing.assert_allclose(got, want, **_tol(dtype))
    t = (torch.from_numpy(np.ascontiguousarray(a)) for a in (q, k, v))
    oracle = torch.nn.functional.scaled_dot_product_attention(
        *t, attn_mask=None if mask is None else torch.from_numpy(mask), scale=0.3).numpy()
    np.testing.assert_allclose(got, oracle, **_tol(dtype))
    out = np.full(got.shape, np.nan, dtype)
    assert attention.fused_attention(q, kt, v, mask, scale=0.3, out=out) is out
    np.testing.assert_array_equal(out, got)


def test_each_shape_takes_its_path():
    f32, f64 = np.float32, np.float64
    for seq, head, dtype, path in ((5, 8, f32, "lanes"), (17, 20, f32, "lanes"),
                                   (40, 8, f32, "lanes"), (33, 16, f32, "blas"),
                                   (64, 8, f32, "blas"), (2, 64, f32, "rows"),
                                   (9, 64, f32, "blas"), (5, 8, f64, "rows"),
                                   (17, 20, f64, "blas")):
        shape = (2, 3, seq, head)
        assert attention._path(shape, (2, 3, head, seq), shape, dtype) == path, (seq, head)


@pytest.mark.parametrize("seq", [4, 40, 64])  # the lanes, the lanes, BLAS products
def test_blocked_and_nan_rows_give_nan_as_the_unfused_softmax(seq):
    q = _heads(1, seq, 2, 8, np.float32, "view")
    kt = _heads(1, seq, 2, 8, np.float32, "contiguous").transpose(0, 1, 3, 2)
    v = _heads(1, seq, 2, 8, np.float32, "view")
    mask = np.zeros((1, 1, seq, seq), np.float32)
    mask[0, 0, 1] = -np.inf  # query row 1 may attend nothing
    q = q.copy()
    q[0, 1, 2, 3] = np.nan  # head 1, query row 2
    got = attention.fused_attention(q, kt, v, mask, scale=0.5)
    want = REFERENCE(q, kt, v, mask, scale=0.5)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got[0, :, 1]).all() and np.isnan(got[0, 1, 2]).all()
    np.testing.assert_allclose(got[~np.isnan(got)], want[~np.isnan(want)], rtol=2e-5,
                               atol=2e-6)


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("seq", [5, 8, 17, 40])  # the lanes: rows ending inside a vector or not
def test_rows_far_below_zero_and_infinite_scores(seq, masked):
    """Each row's maximum is its own scores' (the lanes past the row's end are no part of it:
    a padding score of 0 taken as the maximum of rows near -3000 would leave every exp 0);
    a row holding +inf or -inf scores gives NaN or its softmax as the unfused ops do."""
    q = np.ascontiguousarray(_heads(2, seq, 3, 8, np.float32, "view"))
    kt = _heads(2, seq, 3, 8, np.float32, "contiguous").transpose(0, 1, 3, 2)
    v = _heads(2, seq, 3, 8, np.float32, "view")
    assert attention._path(q.shape, kt.shape, v.shape, np.float32) == "lanes"
    low = np.full((1, 1, seq, seq), -3000, np.float32) + RNG.standard_normal((1, 1, seq, seq)
                                                                            ).astype(np.float32)
    q[0, 0, 0, 0] = np.inf  # head 0, query row 0: infinite scores of both signs
    q[1, 2, 1] = -np.inf  # head 2, query row 1: all infinite
    if masked:
        mask, scale = low, np.float32(0.5)
    else:
        q[0, 1] -= 3000  # head 1's rows: scores far below zero through Q itself
        q[0, 1] *= 0.001
        kt = kt.copy()
        kt[0, 1] = 3000.0 * np.sign(kt[0, 1]) + kt[0, 1]
        mask, scale = None, np.float32(1.0)
    got = attention.fused_attention(q, kt, v, mask, scale=scale)
    want = REFERENCE(q, kt, v, mask, scale=scale)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got).any() and not np.isnan(got[1, 0]).any()
    np.testing.assert_allclose(got[~np.isnan(got)], want[~np.isnan(want)], rtol=2e-4,
                               atol=2e-5)


def test_ranks_two_and_three():
    for shape in ((6, 8), (4, 6, 8)):
        q = RNG.standard_normal(shape).astype(np.float32)
        kt = np.swapaxes(RNG.standard_normal(shape).astype(np.float32), -1, -2)
        v = RNG.standard_normal(shape[:-1] + (5,)).astype(np.float32)
        np.testing.assert_allclose(attention.fused_attention(q, kt, v, scale=0.7),
                                   REFERENCE(q, kt, v, scale=0.7), rtol=2e-5, atol=2e-6)


def test_support_declines_what_the_kernel_does_not_cover():
    q = np.zeros((2, 3, 4, 8), np.float32)
    kt = np.zeros((2, 3, 8, 4), np.float32)
    v = np.zeros((2, 3, 4, 8), np.float32)
    assert supports(q, kt, v)
    assert not supports(q.astype(np.float16), kt.astype(np.float16), v.astype(np.float16))
    assert not supports(q, kt[:, :1], v)  # heads broadcast between Q and Kt
    assert not supports(q, kt, v, np.zeros((4, 4), np.float64))  # another dtype
    assert not supports(q[None], kt[None], v[None])  # rank 5


def test_inputs_the_kernels_do_not_cover_go_to_the_reference():
    """Called directly (not through the registry's supports check), the kernel never reads
    past an input: heads broadcast between Q and Kt, or float16, are the reference's result;
    a mask that does not broadcast is an error, never a garbage result; a strided out= is
    written itself."""
    q = RNG.standard_normal((2, 3, 5, 8)).astype(np.float32)
    kt = RNG.standard_normal((2, 1, 8, 5)).astype(np.float32)  # one KV head for three
    v = RNG.standard_normal((2, 1, 5, 4)).astype(np.float32)
    np.testing.assert_array_equal(attention.fused_attention(q, kt, v, scale=0.5),
                                  REFERENCE(q, kt, v, scale=0.5))
    half = [a.astype(np.float16) for a in (q, kt[:, [0, 0, 0]], v[:, [0, 0, 0]])]
    np.testing.assert_array_equal(attention.fused_attention(*half), REFERENCE(*half))
    full = (q, np.repeat(kt, 3, axis=1), np.repeat(v, 3, axis=1))
    with pytest.raises(ValueError):
        attention.fused_attention(*full, np.zeros((1, 1, 1, 7), np.float32))  # 7 keys of 5
    q3, kt3, v3 = q.reshape(6, 5, 8), full[1].reshape(6, 8, 5), full[2].reshape(6, 5, 4)
    strided = np.full((6, 4, 5), np.nan, np.float32).transpose(0, 2, 1)  # written, not a copy
    assert attention.fused_attention(q3, kt3, v3, out=strided) is strided
    np.testing.assert_allclose(strided, REFERENCE(q3, kt3, v3), rtol=2e-5, atol=2e-6)


def test_lanes_parallel_variant_equals_the_serial():
    """The prange variant (taken past the dual kernel's size threshold with several threads)
    computes what the serial one does, head for head."""
    q = _heads(2, 17, 3, 16, np.float32, "view")
    kt = _heads(2, 17, 3, 16, np.float32, "view").transpose(0, 1, 3, 2)
    v = _heads(2, 17, 3, 20, np.float32, "view")
    mask = RNG.standard_normal((1, 1, 17, 17)).astype(np.float32)
    scratch = np.empty(2 * 3 * (16 * 24 + 17 * 24 + 2 * 17 * 24 + 4 * 24 + 17), np.float32)
    outs = []
    for variant in (attention._attention_lanes.serial, attention._attention_lanes.parallel):
        out = np.full((2, 3, 17, 20), np.nan, np.float32)
        variant(q, kt, v, mask, True, np.float32(0.25), scratch, out, False)
        outs.append(out)
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_allclose(outs[0], REFERENCE(q, kt, v, mask, scale=0.25), rtol=2e-5,
                               atol=2e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("seq,head", [(5, 8), (17, 20), (33, 16)])  # lanes, lanes, BLAS
def test_transposed_output_is_the_heads_gathered_back(dtype, seq, head):
    """``transpose_output``: the result written as (B, S, H, Dv), each row where the
    Transpose (0, 2, 1, 3) after attention would put it; eager, planned, into ``out``, and the
    reference agree with torch's result transposed."""
    import torch

    from onemodel.tensors.ops.specialize import CallSite, specialize

    q, k, v = (_heads(2, seq, 3, head, dtype, "view") for _ in range(3))
    kt = k.transpose(0, 1, 3, 2)
    mask = RNG.standard_normal((2, 1, 1, seq)).astype(dtype)
    t = (torch.from_numpy(np.ascontiguousarray(a)) for a in (q, k, v))
    want = torch.nn.functional.scaled_dot_product_attention(
        *t, attn_mask=torch.from_numpy(mask), scale=0.3).numpy().transpose(0, 2, 1, 3)
    assert supports(q, kt, v, mask, scale=0.3, transpose_output=1)
    got = attention.fused_attention(q, kt, v, mask, scale=0.3, transpose_output=1)
    assert got.shape == (2, seq, 3, head) and got.flags.c_contiguous
    np.testing.assert_allclose(got, want, **_tol(dtype))
    np.testing.assert_allclose(REFERENCE(q, kt, v, mask, scale=0.3, transpose_output=1), want,
                               **_tol(dtype))
    attrs = {"scale": 0.3, "transpose_output": 1}
    site = CallSite((q.shape, kt.shape, v.shape, mask.shape), (q.dtype,) * 4,
                    (None, None, None, None), attrs, (want.shape,),
                    lambda *a, out=None: attention.fused_attention(*a, **attrs, out=out))
    call = specialize(attention.fused_attention, site)
    out = np.full(want.shape, np.nan, dtype)
    assert call(q, kt, v, mask, out=out) is out
    np.testing.assert_allclose(out, want, **_tol(dtype))
    np.testing.assert_allclose(call(q, kt, v, mask), want, **_tol(dtype))
    # a three-axis call cannot gather heads: declined, and the op's shape rule says why
    assert not supports(q[0], kt[0], v[0], None, transpose_output=1)
    # an out= in the untransposed layout is not written through without bounds checks: the
    # reference refuses it
    wrong = np.empty((2, 3, seq, head), dtype)
    with pytest.raises(ValueError):
        attention.fused_attention(q, kt, v, mask, scale=0.3, transpose_output=1, out=wrong)
