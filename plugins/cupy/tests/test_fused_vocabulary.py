"""The cupy FusedElementwise kernel over the whole fusion vocabulary: every op whose definition
gives ``chain_operands`` (read from ``OPS``, so an op that joins the vocabulary later fails here
until this plugin writes it), alone and in a chain, with its literals, against the reference
``FusedElementwise`` kernel: the host path with numpy as the namespace, and the generated C body
compiled as plain C over double inputs with NaN, infinities and signed zeros."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

from onemodel.cupy import fused
from onemodel.tensors.ops import OPS
from onemodel.tensors.ops.fused import chain_literals, parse_program

CHAINABLE = sorted(n for n, o in OPS.items() if o.chain_operands is not None)

# literals for the ops whose constant inputs have no default (the rest: attribute defaults, and
# the defaults moved off their values)
LITERALS = {
    "Clip": [(0.1, float("nan")), (float("nan"), 2.5), (-1.0, 1.0)],
    "Pow": [(2.0,), (3.0,), (0.5,), (-1.0,), (1.0,), (0.0,), (-2.0,), (1.5,)],
}


def _literal_sets(op: str) -> list[tuple[float, ...]]:
    if op in LITERALS:
        return LITERALS[op]
    opdef = OPS[op]
    assert len(chain_literals(op)) == len(opdef.attrs), (
        f"{op} has constant inputs in a chain: give its literals in LITERALS")
    defaults = tuple(float(v) for v in opdef.attrs.values())
    return [defaults] + ([tuple(v * 1.5 + 0.1 for v in defaults)] if defaults else [])


def _text(op: str, refs: list[str], lits) -> str:
    return " ".join([op, *refs, *(repr(float(v)) for v in lits)])


def _programs() -> list[tuple[str, list[str], int]]:
    """(id, program, inputs): each op alone, then after a Mul and followed by an Add."""
    out = []
    for op in CHAINABLE:
        arity = OPS[op].chain_operands
        for k, lits in enumerate(_literal_sets(op)):
            alone = _text(op, [f"x{j}" for j in range(arity)], lits)
            out.append((f"{op}-{k}-alone", [alone], arity))
            step = _text(op, ["t0"] + ["x1"] * (arity - 1), lits)
            out.append((f"{op}-{k}-chain", ["Mul x0 x1", step, "Add t1 x0"], 2))
    return out


PROGRAMS = _programs()
rng = np.random.default_rng(7)


def _inputs(n: int, dtype, size: int = 64) -> list[np.ndarray]:
    vals = [rng.uniform(-4, 4, size).astype(dtype) for _ in range(n)]
    # edges: clamps and the Relu/LeakyRelu sign test, HardSwish's -3/3 corners
    vals[0][:8] = [0.0, -0.0, -3.0, 3.0, -2.5, 2.5, 6.0, -6.0]
    vals[-1][8:11] = [np.nan, np.inf, -np.inf]
    return vals


def test_every_fusable_op_has_an_expression():
    assert set(CHAINABLE) == set(fused._EXPR)
    assert fused.supports(program=[p for _, prog, _ in PROGRAMS for p in prog])


def test_pow_one_half_is_a_square_root_where_numpy_takes_one():
    """numpy's float32/float64 power takes sqrt for the exponent 0.5 (sqrt(-inf) is NaN,
    pow(-inf, 0.5) inf); its float16 loop does not."""
    x = np.array([-np.inf, 4.0])
    with np.errstate(invalid="ignore"):
        for dtype, name in ((np.float16, "pow("), (np.float32, "sqrt("), (np.float64, "sqrt(")):
            assert name in fused.source(parse_program(["Pow x0 0.5"], 1), 1, dtype)
            ref = OPS["FusedElementwise"].kernel(x.astype(dtype), program=["Pow x0 0.5"])
            assert np.isnan(ref[0]) == (name == "sqrt(")


def test_supports_refuses_a_program_with_an_op_it_cannot_write(monkeypatch):
    monkeypatch.delitem(fused._EXPR, "HardSwish")
    assert not fused.supports(program=["Mul x0 x1", "HardSwish t0"])
    assert fused.supports(program=["Mul x0 x1", "Relu t0"])


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("program, n", [(p, n) for _, p, n in PROGRAMS],
                         ids=[i for i, _, _ in PROGRAMS])
def test_host_path_matches_the_reference(program, n, dtype):
    values = _inputs(n, dtype)
    with np.errstate(all="ignore"):
        want = OPS["FusedElementwise"].kernel(*[v.copy() for v in values], program=program)
        got = fused.fused_elementwise(*values, program=program)
    assert got.dtype == want.dtype and got.shape == want.shape
    tol = {np.float16: 2e-3, np.float32: 2e-6, np.float64: 1e-13}[dtype]
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol,
                               atol=tol, equal_nan=True)


def _c(v: float) -> str:
    if np.isnan(v):
        return "NAN"
    if np.isinf(v):
        return "INFINITY" if v > 0 else "-INFINITY"
    return repr(float(v))


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler to check the generated "
                                                        "FusedElementwise source with")
def test_generated_source_matches_the_reference(tmp_path):
    """All programs in one C file (one compile): the body the GPU's ElementwiseKernel gets, as
    plain C over doubles, against the reference chain in float64, special values included."""
    size = 72
    cases = []
    for k, (_, program, n) in enumerate(PROGRAMS):
        values = _inputs(n, np.float64, size)
        values[0][8:14] = [np.nan, np.inf, -np.inf, 1e300, -1e300, 1e-310]
        if n > 1:
            values[1][8:14] = [1.0, 0.5, 2.0, -1.0, 0.0, np.nan]
        cases.append((k, program, n, values))
    parts = ["#include <math.h>", "#include <stdio.h>", "typedef double C;", "typedef double T;"]
    for k, program, n, values in cases:
        params = ", ".join(f"T x{j}" for j in range(n))
        parts += [f"static double f{k}({params}) {{ T y;",
                  fused.source(parse_program(program, n), n), "return y; }"]
        parts += [f"static const double in{k}_{j}[] = {{{', '.join(_c(v) for v in values[j])}}};"
                  for j in range(n)]
    parts.append("int main(void) {")
    for k, _program, n, _values in cases:
        args = ", ".join(f"in{k}_{j}[i]" for j in range(n))
        parts.append(f"for (int i = 0; i < {size}; i++) printf(\"%.17g\\n\", f{k}({args}));")
    parts.append("return 0; }")
    src = tmp_path / "chains.c"
    src.write_text("\n".join(parts))
    exe = tmp_path / "chains"
    subprocess.run(["cc", "-std=c99", "-O0", "-o", str(exe), str(src), "-lm"], check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()
    got = np.asarray([float(v) for v in out]).reshape(len(cases), size)
    for (_k, program, _n, values), g in zip(cases, got):
        with np.errstate(all="ignore"):
            want = OPS["FusedElementwise"].kernel(*values, program=program)
        np.testing.assert_allclose(g, want, rtol=1e-12, atol=1e-300, equal_nan=True,
                                   err_msg=f"program {program}")


def test_on_the_gpu_matches_the_reference():
    """The real generated kernel (skipped where CuPy or a GPU is missing)."""
    cupy = pytest.importorskip("cupy")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no CUDA device")
    except cupy.cuda.runtime.CUDARuntimeError as e:
        pytest.skip(f"no CUDA device: {e}")
    for dtype, tol in ((np.float32, 2e-6), (np.float64, 1e-13), (np.float16, 2e-3)):
        for _, program, n in PROGRAMS:
            values = _inputs(n, dtype)
            with np.errstate(all="ignore"):
                want = OPS["FusedElementwise"].kernel(*[v.copy() for v in values],
                                                      program=program)
            got = cupy.asnumpy(fused.fused_elementwise(*[cupy.asarray(v) for v in values],
                                                       program=program))
            np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64),
                                       rtol=tol, atol=tol, equal_nan=True,
                                       err_msg=f"{dtype.__name__} {program}")


def test_the_registered_kernel_refuses_a_program_it_cannot_write():
    """Kernel choice consults fused.supports, so a program with an op the generated C lacks
    falls back to the host instead of failing on the device."""
    from onemodel.tensors import registry

    recs = [r for r in registry.kernels()["FusedElementwise"] if r.plugin == "cupy"]
    assert recs, "the cupy plugin registers FusedElementwise"
    check = recs[0].supports_function()
    x = np.zeros(3, np.float32)
    assert check(x, program=("Relu x0",))
    assert not check(x, program=("NoSuchOp x0",))
