"""The numba FusedGemm (BLAS product, then the bias row and activation in one pass) against
PyTorch's linear layer and activations: float32 and float64, transposed operands, no bias,
NaN and infinities, a planned buffer, and a session over an MLP whose linear layers the passes
fuse, run with the plugin and against torch."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from onemodel.numba import gemm
from onemodel.runtime import GraphBuilder, Session
from onemodel.tensors import DType

ACTS = {"Relu": torch.relu, "Sigmoid": torch.sigmoid, "Tanh": torch.tanh,
        "HardSwish": lambda t: t * torch.clamp(t / 6 + 0.5, 0, 1)}  # ONNX's formula
TOL = {np.float32: dict(rtol=1e-5, atol=1e-5), np.float64: dict(rtol=1e-12, atol=1e-12)}


def _torch(x, w, b, act, trans_b):
    """act(x @ W + b) in torch, W given as (K, N) or, with ``trans_b``, as (N, K)."""
    weight = torch.from_numpy(w if trans_b else np.ascontiguousarray(w.T))
    bias = None if b is None else torch.from_numpy(b)
    return ACTS[act](torch.nn.functional.linear(torch.from_numpy(x), weight, bias)).numpy()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("bias", [True, False])
def test_matches_torch(dtype, act, trans_b, bias):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 33)).astype(dtype)
    x[0, 3], x[1, 4], x[2, 5] = np.nan, np.inf, -np.inf
    w = rng.standard_normal((17, 33) if trans_b else (33, 17)).astype(dtype)
    b = rng.standard_normal(17).astype(dtype) if bias else None
    want = _torch(x, w, b, act, trans_b)
    got = gemm.fused_gemm(x, w, b, activation=act, transB=trans_b)
    np.testing.assert_allclose(got, want, **TOL[dtype])
    out = np.full(want.shape, np.nan, dtype)
    assert gemm.fused_gemm(x, w, b, activation=act, transB=trans_b, out=out) is out
    np.testing.assert_allclose(out, want, **TOL[dtype])


def test_a_session_over_an_mlp_uses_it_and_matches_torch():
    rng = np.random.default_rng(5)
    sizes = (20, 32, 32, 4)
    weights = [(rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32)
               for n_in, n_out in itertools.pairwise(sizes)]
    biases = [rng.standard_normal(n_out).astype(np.float32) for n_out in sizes[1:]]
    b = GraphBuilder()
    h = b.input("x", DType.F32, ("batch", sizes[0]))
    for i, (w, bias) in enumerate(zip(weights, biases)):
        w_in, b_in = b.initializer(f"fc{i}.weight", w), b.initializer(f"fc{i}.bias", bias)
        h = b.op("Add", b.op("MatMul", h, w_in), b_in)
        if i < len(weights) - 1:
            h = b.op("Relu", h)
    b.output(h, "y")
    session = Session(b.build())
    for batch in (1, 3):
        x = rng.standard_normal((batch, sizes[0])).astype(np.float32)
        got = session.run({"x": x}, return_numpy=True)["y"]
        t = torch.from_numpy(x)
        for i, (w, bias) in enumerate(zip(weights, biases)):
            t = t @ torch.from_numpy(w) + torch.from_numpy(bias)
            if i < len(weights) - 1:
                t = torch.relu(t)
        np.testing.assert_allclose(got, t.numpy(), rtol=1e-5, atol=1e-5)
        plan = session.plan_for({"x": (batch, sizes[0])})
        fused = [st for st in plan.steps if st.op == "FusedGemm"]
        assert len(fused) == 2 and all(
            getattr(st.call, "__qualname__", "").startswith("_fused_gemm_at") for st in fused)
