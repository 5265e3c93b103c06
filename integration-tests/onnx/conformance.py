"""Running ONNX's backend node-test suite (the cases the ``onnx`` package generates) against a
backend, case by case, with outcomes grouped by why a case did not pass."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from onemodel.tensors.ops import OPS
from onemodel.tensors.ops.adapters import ONNX_ADAPTERS


@dataclass
class Outcome:
    name: str
    status: str  # passed, unsupported (an op outside the op set), failed, error
    detail: str = ""


def node_cases():
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_model_tests(kind="node")


def ops_of(model) -> set[str]:
    out = set()
    for n in model.graph.node:
        out.add(n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}")
    return out


def supported(model) -> bool:
    """Every op of the case is in OneModel's op set (Constant is folded on import,
    ConstantOfShape folded or converted to Expand, a legacy op such as Upsample adapted to its
    successor on import)."""
    return all(op in ("Constant", "ConstantOfShape") or op in ONNX_ADAPTERS
               or (op in OPS and not OPS[op].domain) for op in ops_of(model))


def run_case(case, run) -> Outcome:
    """``run(model, inputs) -> outputs``; compares every data set with the case's tolerances."""
    try:
        for inputs, expected in case.data_sets:
            inputs, expected = [_array(x) for x in inputs], [_array(x) for x in expected]
            got = run(case.model, inputs)
            if len(got) < len(expected):
                return Outcome(case.name, "failed", f"{len(got)} outputs, {len(expected)} expected")
            for g, e in zip(got, expected):
                if isinstance(e, list) or e is None or isinstance(g, list) or g is None:
                    detail = _compare_value(g, e, case)  # a sequence or an optional
                    if detail:
                        return Outcome(case.name, "failed", detail)
                    continue
                e = np.asarray(e)
                g = np.asarray(g)
                if e.dtype == object or g.shape != e.shape:
                    return Outcome(case.name, "failed", f"shape {g.shape} != {e.shape}")
                if e.dtype.name == "bfloat16":  # as ONNX's runner: two bfloat16 ulps
                    np.testing.assert_allclose(g.astype(np.float32), e.astype(np.float32),
                                               rtol=max(case.rtol, 2**-6), atol=case.atol)
                elif e.dtype.kind in "fc":
                    np.testing.assert_allclose(g.astype(e.dtype), e, rtol=case.rtol,
                                               atol=case.atol)
                else:
                    np.testing.assert_array_equal(g, e)
        return Outcome(case.name, "passed")
    except AssertionError as exc:
        return Outcome(case.name, "failed", str(exc).strip().splitlines()[0][:200])
    except Exception as exc:
        return Outcome(case.name, "error", f"{type(exc).__name__}: {str(exc)[:300]}")


def _compare_value(g, e, case) -> str:
    """'' when a sequence (list) or optional (None: empty) result matches, else why not."""
    if e is None or g is None:
        return "" if e is None and g is None else f"got {type(g).__name__}, expected " \
            f"{type(e).__name__}"
    if not isinstance(e, list) or not isinstance(g, list):
        return f"got {type(g).__name__}, expected {type(e).__name__}"
    if len(g) != len(e):
        return f"sequence of {len(g)}, {len(e)} expected"
    for gi, ei in zip(g, e):
        gi, ei = np.asarray(gi), np.asarray(ei)
        if gi.shape != ei.shape:
            return f"shape {gi.shape} != {ei.shape} in a sequence"
        if ei.dtype.kind in "fc":
            np.testing.assert_allclose(gi.astype(ei.dtype), ei, rtol=case.rtol, atol=case.atol)
        else:
            np.testing.assert_array_equal(gi, ei)
    return ""


def _array(x):
    """Case data are numpy arrays, or TensorProtos in some cases."""
    if hasattr(x, "raw_data") or hasattr(x, "data_type"):
        from onnx import numpy_helper

        return numpy_helper.to_array(x)
    return x


def onemodel_runner():
    from onemodel.onnx.backend import OneModelBackend

    def run(model, inputs):
        return OneModelBackend.run_model(model, inputs)

    return run


def onnxruntime_runner():
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    opts.log_severity_level = 4

    def run(model, inputs):
        s = ort.InferenceSession(model.SerializeToString(), opts,
                                 providers=["CPUExecutionProvider"])
        names = [i.name for i in s.get_inputs()]
        return s.run(None, dict(zip(names, inputs)))

    return run
