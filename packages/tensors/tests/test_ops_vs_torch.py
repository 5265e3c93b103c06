"""Every differentiable op, forward and backward, against PyTorch and finite differences.

One row per op (or op configuration): how to call it here, how to call it in PyTorch, and the
inputs (shapes with broadcasting, positive domains, integer index inputs)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from onemodel.tensors import DType, Tensor, concat, split, stack, where
from onemodel.tensors import functional as F
from onemodel.tensors.dispatch import dispatch

torch = pytest.importorskip("torch")
TF = torch.nn.functional
pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same'")


@dataclass
class Arg:
    shape: tuple
    kind: str = "real"  # real, positive, index:N (integers below N), bool, const (no grad)

    def make(self, rng):
        if self.kind == "real":
            return rng.standard_normal(self.shape)
        if self.kind == "positive":
            return rng.uniform(0.5, 2.0, self.shape)
        if self.kind == "bool":
            return rng.random(self.shape) > 0.5
        if self.kind.startswith("index:"):
            return rng.integers(0, int(self.kind[6:]), self.shape).astype(np.int64)
        if self.kind == "const":
            return rng.standard_normal(self.shape)
        if self.kind == "positive_const":
            return rng.uniform(0.5, 2.0, self.shape)
        raise ValueError(self.kind)

    @property
    def differentiable(self):
        return self.kind in ("real", "positive")


@dataclass
class Row:
    name: str
    ours: Callable
    theirs: Callable
    args: list[Arg]
    fd: bool = True  # check against finite differences too
    atol: float = 1e-9
    extra: dict[str, Any] = field(default_factory=dict)

    def __str__(self):
        return self.name


def A(*shape, kind="real"):
    return Arg(tuple(shape), kind)


def _tsum(x, axis=None, keepdims=False):
    return x.sum() if axis is None else x.sum(dim=axis, keepdim=keepdims)


ROWS = [
    # arithmetic with broadcasting
    Row("add", lambda a, b: a + b, lambda a, b: a + b, [A(3, 4), A(4)]),
    Row("add_scalar", lambda a: 2.5 + a, lambda a: 2.5 + a, [A(3, 4)]),
    Row("sub", lambda a, b: a - b, lambda a, b: a - b, [A(2, 1, 4), A(3, 1)]),
    Row("rsub_scalar", lambda a: 1 - a, lambda a: 1 - a, [A(5)]),
    Row("mul", lambda a, b: a * b, lambda a, b: a * b, [A(2, 3, 4), A(3, 1)]),
    Row("div", lambda a, b: a / b, lambda a, b: a / b, [A(3, 4), A(4, kind="positive")]),
    Row("rdiv_scalar", lambda a: 1 / a, lambda a: 1 / a, [A(3, kind="positive")]),
    Row("pow", lambda a, b: a**b, lambda a, b: a**b, [A(3, 4, kind="positive"), A(4)]),
    Row("pow_scalar", lambda a: a**3, lambda a: a**3, [A(3, 4)]),
    Row("neg", lambda a: -a, lambda a: -a, [A(3, 4)]),
    Row("abs", lambda a: a.abs(), lambda a: a.abs(), [A(3, 4)]),
    Row("exp", lambda a: a.exp(), lambda a: a.exp(), [A(3, 4)]),
    Row("log", lambda a: a.log(), lambda a: a.log(), [A(3, 4, kind="positive")]),
    Row("sqrt", lambda a: a.sqrt(), lambda a: a.sqrt(), [A(3, 4, kind="positive")]),
    Row("tanh", lambda a: a.tanh(), lambda a: a.tanh(), [A(3, 4)]),
    Row("sigmoid", lambda a: a.sigmoid(), lambda a: a.sigmoid(), [A(3, 4)]),
    Row("relu", lambda a: a.relu(), lambda a: a.relu(), [A(3, 4)]),
    Row("gelu", lambda a: a.gelu(), lambda a: TF.gelu(a), [A(3, 4)]),
    Row("gelu_tanh", lambda a: a.gelu("tanh"), lambda a: TF.gelu(a, approximate="tanh"),
        [A(3, 4)]),
    Row("erf", lambda a: a.erf(), lambda a: torch.erf(a), [A(3, 4)]),
    Row("clip", lambda a: a.clip(-0.5, 0.7), lambda a: a.clamp(-0.5, 0.7), [A(4, 5)]),
    Row("where", lambda c, a, b: where(c, a, b), lambda c, a, b: torch.where(c, a, b),
        [A(3, 1, kind="bool"), A(3, 4), A(4)]),
    Row("reciprocal", lambda a: dispatch("Reciprocal", (a,)), lambda a: a.reciprocal(),
        [A(3, 4, kind="positive")]),
    Row("sum_variadic", lambda a, b, c: dispatch("Sum", (a, b, c)), lambda a, b, c: a + b + c,
        [A(2, 3), A(3), A(1, 3)]),
    Row("flatten_op", lambda a: dispatch("Flatten", (a,), {"axis": 2}),
        lambda a: a.reshape(a.shape[0] * a.shape[1], -1), [A(2, 3, 4)]),
    Row("identity_clone", lambda a: a.clone() * 2, lambda a: a.clone() * 2, [A(3)]),
    Row("cast_f32_f64", lambda a: a.cast(DType.F32).cast(DType.F64) * a,
        lambda a: a.float().double() * a, [A(3)], fd=False),
    # reductions
    Row("sum_all", lambda a: a.sum(), lambda a: a.sum(), [A(3, 4)]),
    Row("sum_axis", lambda a: a.sum(axis=1), lambda a: a.sum(dim=1), [A(3, 4, 2)]),
    Row("sum_keepdims", lambda a: a.sum(axis=(0, 2), keepdims=True),
        lambda a: a.sum(dim=(0, 2), keepdim=True), [A(3, 4, 2)]),
    Row("mean_axis", lambda a: a.mean(axis=-1), lambda a: a.mean(dim=-1), [A(3, 4)]),
    Row("max_axis", lambda a: a.max(axis=1), lambda a: a.amax(dim=1), [A(3, 5)]),
    Row("min_all", lambda a: a.min(), lambda a: a.amin(), [A(3, 5)]),
    Row("var", lambda a: a.var(axis=1), lambda a: a.var(dim=1), [A(3, 5)]),
    Row("var_biased_all", lambda a: a.var(correction=0), lambda a: a.var(correction=0),
        [A(3, 5)]),
    Row("softmax", lambda a: a.softmax(1), lambda a: a.softmax(1), [A(3, 5)]),
    Row("log_softmax", lambda a: a.log_softmax(-1), lambda a: a.log_softmax(-1), [A(3, 5)]),
    # linear algebra
    Row("matmul", lambda a, b: a @ b, lambda a, b: a @ b, [A(3, 4), A(4, 5)]),
    Row("matmul_batched", lambda a, b: a @ b, lambda a, b: a @ b, [A(2, 3, 4), A(4, 5)]),
    Row("matmul_broadcast", lambda a, b: a @ b, lambda a, b: a @ b, [A(2, 1, 3, 4), A(3, 4, 2)]),
    Row("matmul_vec", lambda a, b: a @ b, lambda a, b: a @ b, [A(4), A(2, 4, 3)]),
    Row("matvec", lambda a, b: a @ b, lambda a, b: a @ b, [A(2, 3, 4), A(4)]),
    Row("linear_2d", F.linear, TF.linear, [A(5, 4), A(3, 4), A(3)]),
    Row("linear_3d", F.linear, TF.linear, [A(2, 5, 4), A(3, 4), A(3)]),
    Row("gemm_transA_alpha_beta",
        lambda a, b, c: dispatch("Gemm", (a, b, c), {"transA": 1, "alpha": 0.7, "beta": 1.3}),
        lambda a, b, c: 0.7 * (a.T @ b) + 1.3 * c, [A(4, 3), A(4, 5), A(3, 1)]),
    Row("gemm_both_transposed",
        lambda a, b: dispatch("Gemm", (a, b), {"transA": 1, "transB": 1}),
        lambda a, b: a.T @ b.T, [A(4, 3), A(5, 4)]),
    # shapes and indexing
    Row("reshape", lambda a: a.reshape(4, -1) * 1, lambda a: a.reshape(4, -1) * 1, [A(2, 3, 2)]),
    Row("transpose", lambda a: a.transpose(0, 2), lambda a: a.transpose(0, 2), [A(2, 3, 4)]),
    Row("permute", lambda a: a.permute(2, 0, 1), lambda a: a.permute(2, 0, 1), [A(2, 3, 4)]),
    Row("flatten", lambda a: a.flatten(1), lambda a: a.flatten(1), [A(2, 3, 4)]),
    Row("squeeze", lambda a: a.squeeze(1), lambda a: a.squeeze(1), [A(2, 1, 4)]),
    Row("unsqueeze", lambda a: a.unsqueeze(-1), lambda a: a.unsqueeze(-1), [A(2, 4)]),
    Row("expand", lambda a: a.expand(3, 2, 4), lambda a: a.expand(3, 2, 4), [A(2, 1)]),
    Row("concat", lambda a, b: concat([a, b], 1), lambda a, b: torch.cat([a, b], 1),
        [A(2, 3), A(2, 5)]),
    Row("stack", lambda a, b: stack([a, b], -1), lambda a, b: torch.stack([a, b], -1),
        [A(2, 3), A(2, 3)]),
    Row("split", lambda a: split(a, [1, 3], 1)[1] * 2, lambda a: torch.split(a, [1, 3], 1)[1] * 2,
        [A(2, 4)]),
    Row("chunk_both", lambda a: (lambda p: p[0] * p[1])(a.chunk(2, 0)),
        lambda a: (lambda p: p[0] * p[1])(a.chunk(2, 0)), [A(4, 3)]),
    Row("getitem_slices", lambda a: a[1:, ::2, -1], lambda a: a[1:, ::2, -1], [A(3, 5, 2)]),
    Row("getitem_negstep", lambda a: a[::-1, 1:3], lambda a: a.flip(0)[:, 1:3], [A(4, 5)]),
    Row("getitem_none_ellipsis", lambda a: a[None, ..., 0], lambda a: a[None, ..., 0],
        [A(2, 3, 4)]),
    Row("getitem_array", lambda a: a[:, [2, 0, 2]], lambda a: a[:, [2, 0, 2]], [A(3, 4)]),
    Row("pad_constant", lambda a: F.pad(a, (1, 2, 0, 1), value=0.5),
        lambda a: TF.pad(a, (1, 2, 0, 1), value=0.5), [A(2, 3, 4)]),
    Row("pad_reflect", lambda a: F.pad(a, (2, 1), mode="reflect"),
        lambda a: TF.pad(a, (2, 1), mode="reflect"), [A(2, 3, 5)]),
    Row("pad_replicate", lambda a: F.pad(a, (1, 2, 2, 1), mode="replicate"),
        lambda a: TF.pad(a, (1, 2, 2, 1), mode="replicate"), [A(1, 2, 3, 4)]),
    # neural network
    Row("conv1d", lambda x, w, b: F.conv1d(x, w, b, stride=2, padding=1),
        lambda x, w, b: TF.conv1d(x, w, b, stride=2, padding=1), [A(2, 3, 9), A(4, 3, 3), A(4)]),
    Row("conv2d", lambda x, w, b: F.conv2d(x, w, b, padding=1),
        lambda x, w, b: TF.conv2d(x, w, b, padding=1), [A(2, 3, 6, 5), A(4, 3, 3, 3), A(4)]),
    Row("conv2d_stride_dilation_groups",
        lambda x, w: F.conv2d(x, w, stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2),
        lambda x, w: TF.conv2d(x, w, stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2),
        [A(2, 4, 7, 6), A(6, 2, 3, 2)]),
    Row("conv2d_same", lambda x, w: F.conv2d(x, w, padding="same"),
        lambda x, w: TF.conv2d(x, w, padding="same"), [A(1, 2, 5, 6), A(3, 2, 4, 3)]),
    Row("conv_transpose2d", lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1,
                                                                output_padding=1),
        lambda x, w, b: TF.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1),
        [A(2, 3, 4, 5), A(3, 2, 3, 3), A(2)]),
    Row("conv_transpose2d_groups", lambda x, w: F.conv_transpose2d(x, w, groups=2, dilation=2),
        lambda x, w: TF.conv_transpose2d(x, w, groups=2, dilation=2),
        [A(1, 4, 3, 3), A(4, 3, 2, 2)]),
    Row("max_pool2d", lambda x: F.max_pool2d(x, 2), lambda x: TF.max_pool2d(x, 2),
        [A(2, 3, 6, 7)]),
    Row("max_pool2d_pad_ceil", lambda x: F.max_pool2d(x, 3, 2, padding=1, ceil_mode=True),
        lambda x: TF.max_pool2d(x, 3, 2, padding=1, ceil_mode=True), [A(1, 2, 8, 7)]),
    Row("avg_pool2d", lambda x: F.avg_pool2d(x, 3, 2, padding=1),
        lambda x: TF.avg_pool2d(x, 3, 2, padding=1), [A(2, 2, 7, 6)]),
    Row("avg_pool2d_exclude_pad_ceil",
        lambda x: F.avg_pool2d(x, 3, 2, padding=1, ceil_mode=True, count_include_pad=False),
        lambda x: TF.avg_pool2d(x, 3, 2, padding=1, ceil_mode=True, count_include_pad=False),
        [A(1, 2, 8, 6)]),
    Row("adaptive_avg_pool2d_1", lambda x: F.adaptive_avg_pool2d(x, 1),
        lambda x: TF.adaptive_avg_pool2d(x, 1), [A(2, 3, 5, 4)]),
    Row("adaptive_avg_pool2d_uneven", lambda x: F.adaptive_avg_pool2d(x, (3, 2)),
        lambda x: TF.adaptive_avg_pool2d(x, (3, 2)), [A(2, 3, 7, 5)]),
    Row("batch_norm_train",
        lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True),
        lambda x, w, b: TF.batch_norm(x, None, None, w, b, training=True),
        [A(4, 3, 2, 2), A(3), A(3)]),
    Row("batch_norm_eval",
        lambda x, w, b, m, v: F.batch_norm(x, m, v, w, b, training=False),
        lambda x, w, b, m, v: TF.batch_norm(x, m, v, w, b, training=False),
        [A(4, 3, 2, 2), A(3), A(3), A(3, kind="const"), A(3, kind="positive_const")]),
    Row("layer_norm", lambda x, w, b: F.layer_norm(x, (4,), w, b),
        lambda x, w, b: TF.layer_norm(x, (4,), w, b), [A(2, 3, 4), A(4), A(4)]),
    Row("layer_norm_2axes", lambda x, w, b: F.layer_norm(x, (3, 4), w, b),
        lambda x, w, b: TF.layer_norm(x, (3, 4), w, b), [A(2, 3, 4), A(3, 4), A(3, 4)]),
    Row("group_norm", lambda x, w, b: F.group_norm(x, 2, w, b),
        lambda x, w, b: TF.group_norm(x, 2, w, b), [A(2, 4, 3, 2), A(4), A(4)]),
    Row("embedding", lambda i, w: F.embedding(i, w), lambda i, w: TF.embedding(i, w),
        [A(2, 3, kind="index:5"), A(5, 4)]),
    Row("sdpa", F.scaled_dot_product_attention, TF.scaled_dot_product_attention,
        [A(2, 3, 4), A(2, 5, 4), A(2, 5, 6)]),
    Row("sdpa_causal", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        lambda q, k, v: TF.scaled_dot_product_attention(q, k, v, is_causal=True),
        [A(1, 2, 4, 3), A(1, 2, 4, 3), A(1, 2, 4, 3)]),
    # PyTorch names added for issue 13: 1-d pooling and transposed convolution, pad modes,
    # GatherElements and TopK (gather, topk, sort), roll
    Row("conv_transpose1d", lambda x, w, b: F.conv_transpose1d(x, w, b, stride=2, padding=1,
                                                                output_padding=1),
        lambda x, w, b: TF.conv_transpose1d(x, w, b, stride=2, padding=1, output_padding=1),
        [A(2, 3, 5), A(3, 2, 3), A(2)]),
    Row("max_pool1d", lambda x: F.max_pool1d(x, 3, 2, padding=1),
        lambda x: TF.max_pool1d(x, 3, 2, padding=1), [A(2, 3, 9)]),
    Row("avg_pool1d_exclude_pad_ceil",
        lambda x: F.avg_pool1d(x, 3, 2, padding=1, ceil_mode=True, count_include_pad=False),
        lambda x: TF.avg_pool1d(x, 3, 2, padding=1, ceil_mode=True, count_include_pad=False),
        [A(2, 2, 8)]),
    Row("adaptive_avg_pool1d_uneven", lambda x: F.adaptive_avg_pool1d(x, 4),
        lambda x: TF.adaptive_avg_pool1d(x, 4), [A(2, 3, 7)]),
    Row("pad_reflect", lambda x: F.pad(x, (2, 1, 1, 2), mode="reflect"),
        lambda x: TF.pad(x, (2, 1, 1, 2), mode="reflect"), [A(1, 2, 4, 5)]),
    Row("pad_replicate", lambda x: F.pad(x, (2, 1), mode="replicate"),
        lambda x: TF.pad(x, (2, 1), mode="replicate"), [A(2, 3, 4)]),
    Row("pad_circular", lambda x: F.pad(x, (1, 2, 2, 0), mode="circular"),
        lambda x: TF.pad(x, (1, 2, 2, 0), mode="circular"), [A(1, 2, 4, 5)]),
    Row("gather", lambda x, i: x.gather(1, i), lambda x, i: x.gather(1, i),
        [A(3, 4, 2), A(3, 6, 2, kind="index:4")]),
    Row("topk", lambda x: x.topk(2, dim=1).values, lambda x: x.topk(2, dim=1).values,
        [A(3, 5, 2)]),
    Row("sort_descending", lambda x: x.sort(dim=0, descending=True).values,
        lambda x: x.sort(dim=0, descending=True).values, [A(4, 3)]),
    Row("roll", lambda x: x.roll((1, -2), (0, 1)), lambda x: x.roll((1, -2), (0, 1)),
        [A(3, 5)]),
]


def _inputs(row, seed=0):
    rng = np.random.default_rng(seed)
    return [arg.make(rng) for arg in row.args]


def _ours(row, arrays, grad=True):
    ts = []
    for arg, a in zip(row.args, arrays):
        t = Tensor.from_numpy(np.array(a))
        if grad and arg.differentiable:
            t.requires_grad_()
        ts.append(t)
    return ts


def _theirs(row, arrays):
    return [torch.tensor(a, requires_grad=arg.differentiable) for arg, a in zip(row.args, arrays)]


@pytest.mark.parametrize("row", ROWS, ids=str)
def test_forward_and_backward_match_torch(row):
    arrays = _inputs(row)
    ours, theirs = _ours(row, arrays), _theirs(row, arrays)
    out, ref = row.ours(*ours), row.theirs(*theirs)
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=1e-9, atol=row.atol)
    assert out.dtype is DType.F64
    upstream = np.random.default_rng(1).standard_normal(ref.shape)
    out.backward(Tensor.from_numpy(upstream))
    ref.backward(torch.tensor(upstream))
    for arg, t, r in zip(row.args, ours, theirs):
        if arg.differentiable:
            assert t.grad is not None, f"{row.name}: no gradient reached an input"
            np.testing.assert_allclose(t.grad.numpy(), r.grad.numpy(), rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("row", [r for r in ROWS if r.fd], ids=str)
def test_backward_matches_finite_differences(row):
    arrays = _inputs(row, seed=2)
    ours = _ours(row, arrays)
    out = row.ours(*ours)
    upstream = np.random.default_rng(3).standard_normal(out.shape)
    out.backward(Tensor.from_numpy(upstream))

    def objective(values):
        return float(np.sum(row.ours(*_ours(row, values, grad=False)).numpy() * upstream))

    eps = 1e-6
    for i, arg in enumerate(row.args):
        if not arg.differentiable:
            continue
        numeric = np.zeros_like(arrays[i])
        for j in np.ndindex(arrays[i].shape):
            plus = [a.copy() for a in arrays]
            minus = [a.copy() for a in arrays]
            plus[i][j] += eps
            minus[i][j] -= eps
            numeric[j] = (objective(plus) - objective(minus)) / (2 * eps)
        np.testing.assert_allclose(ours[i].grad.numpy(), numeric, rtol=1e-5, atol=1e-6,
                                   err_msg=f"{row.name}: input {i}")


@pytest.mark.parametrize("dtype", [DType.F32, DType.F64])
def test_float32_forward_close_to_torch(dtype):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 3, 8, 8)).astype(dtype.numpy)
    w = rng.standard_normal((4, 3, 3, 3)).astype(dtype.numpy)
    ours = F.conv2d(Tensor.from_numpy(x), Tensor.from_numpy(w), padding=1).relu()
    ref = TF.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=1).relu()
    assert ours.dtype is dtype
    np.testing.assert_allclose(ours.numpy(), ref.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("rows, cols", [(8, 40), (16, 64), (64, 256), (3, 64), (32, 32)])
def test_float32_linear_close_to_torch(rows, cols):
    """float32 ``x @ W.T + b`` with few rows against many columns is computed transposed
    ((W @ x.T).T, linalg._wide_transposed): the values and gradients match torch's all the
    same, on both sides of the rule."""
    rng = np.random.default_rng(rows)
    x, w = rng.standard_normal((rows, 50)), rng.standard_normal((cols, 50))
    b, g = rng.standard_normal(cols), rng.standard_normal((rows, cols))
    ours = [Tensor.from_numpy(a.astype(np.float32)).requires_grad_() for a in (x, w, b)]
    theirs = [torch.tensor(a.astype(np.float32), requires_grad=True) for a in (x, w, b)]
    out, ref = F.linear(*ours), TF.linear(*theirs)
    assert out.dtype is DType.F32 and out.numpy().flags.c_contiguous
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=1e-5, atol=1e-5)
    out.backward(Tensor.from_numpy(g.astype(np.float32)))
    ref.backward(torch.tensor(g.astype(np.float32)))
    for t, r in zip(ours, theirs):
        np.testing.assert_allclose(t.grad.numpy(), r.grad.numpy(), rtol=1e-5, atol=1e-4)
