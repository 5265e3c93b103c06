"""ONNX's backend node-test suite (every case the installed ``onnx`` package generates) run
against OneModel through the ``onnx.backend.base.Backend`` adapter.

Every case either passes, or fails the way it is expected to:

- cases using an op outside OneModel's op set must be refused at import with an error that
  names the op, its domain and opset (``UnsupportedOpError``);
- cases using an element type outside the DType set (strings, float6, complex...)
  must be refused with an error that names the type;
- the few cases in ``EXPECTED_FAILURES`` below fail for the reason given there (strict: if one
  starts passing, the list must shrink).

``python scripts/onnx_conformance.py`` prints the counts beside onnxruntime's on this harness.
"""

from __future__ import annotations

import pytest

pytest.importorskip("onnx")
pytest.importorskip("onemodel.onnx")

from conformance import node_cases, ops_of, run_case, supported

from onemodel.onnx.backend import OneModelBackend
from onemodel.onnx.dtypes import FROM_ONNX

# Cases whose ops are all in the op set but which fail on purpose.
EXPECTED_FAILURES = {
    # Dropout in training mode draws a random mask; the expected outputs come from numpy's
    # global random state in ONNX's generator, which no backend can reproduce.
    "test_training_dropout": "random mask",
    "test_training_dropout_default": "random mask",
    "test_training_dropout_default_mask": "random mask",
    "test_training_dropout_mask": "random mask",
    # BatchNormalization with training_mode=1 (batch statistics and running-statistics
    # outputs): inference graphs only; training uses onemodel.training.
    "test_batchnorm_example_training_mode": "training-mode BatchNormalization",
    "test_batchnorm_epsilon_training_mode": "training-mode BatchNormalization",
    # BF16 arithmetic: Einsum and Celu compute BF16 in float32; the elementwise ops these
    # expansions use (Div, Mul, Elu, MatMul, Softmax...) refuse BF16 with a DTypeError naming
    # the op and dtype.
    "test_celu_bfloat16_expanded": "BF16 arithmetic",
    "test_attention_4d_causal_bf16_expanded": "BF16 arithmetic",
    "test_attention_4d_padded_kv_bf16_expanded": "BF16 arithmetic",
    "test_attention_4d_causal_padded_kv_bf16_expanded": "BF16 arithmetic",
    "test_attention_4d_attn_mask_causal_bf16_expanded": "BF16 arithmetic",
    "test_attention_3d_causal_bf16_expanded": "BF16 arithmetic",
}

CASES = node_cases()


def _elem_types(model) -> set[int]:
    out = set()
    for v in list(model.graph.input) + list(model.graph.output):
        out.add(_elem_type(v.type))
    for t in model.graph.initializer:
        out.add(t.data_type)
    return out


def _elem_type(t) -> int:
    """The element type of a tensor, of a sequence's or an optional's tensors; -1 for maps and
    other types OneModel has no value for."""
    kind = t.WhichOneof("value")
    if kind == "tensor_type":
        return t.tensor_type.elem_type
    if kind == "sequence_type":
        return _elem_type(t.sequence_type.elem_type)
    if kind == "optional_type":
        return _elem_type(t.optional_type.elem_type)
    return -1


def _run(model, inputs):
    return OneModelBackend.run_model(model, inputs)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_node_case(case):
    outcome = run_case(case, _run)
    if not supported(case.model):
        missing = sorted(op for op in ops_of(case.model) if op != "Constant"
                         and not _in_op_set(op))
        assert outcome.status == "error" and (
            "UnsupportedOpError" in outcome.detail or "element type" in outcome.detail
            or "not a tensor" in outcome.detail), outcome.detail
        assert any(op.split(".")[-1] in outcome.detail for op in missing) or \
            "element type" in outcome.detail, (missing, outcome.detail)
        return
    if _elem_types(case.model) - set(FROM_ONNX):
        assert outcome.status == "error" and "element type" in outcome.detail, outcome.detail
        return
    if case.name in EXPECTED_FAILURES:
        assert outcome.status != "passed", (
            f"{case.name} passes now: remove it from EXPECTED_FAILURES")
        return
    assert outcome.status == "passed", f"{outcome.status}: {outcome.detail}"


def _in_op_set(op: str) -> bool:
    from onemodel.tensors.ops import OPS

    return op in OPS and not OPS[op].domain
