"""FusedGemm (Gemm, then Relu, Sigmoid or Tanh): the product stays in BLAS (the reference Gemm
kernel, or its plan-time specialized call), then the bias row and the activation are applied to
the result in one numba pass. The reference adds the bias and applies the activation as two
numpy calls, about 0.7 us each on the small outputs of a traced MLP at batch 1.

Both FusedGemm and MatMul take the numba skinny product (:func:`conv._skinny_gemm`) for a few
rows by large constant weights, which OpenBLAS packs on every call."""

from __future__ import annotations

import math
import threading
import weakref
from dataclasses import replace

import numpy as np

from onemodel.tensors.ops import OPS
from onemodel.tensors.ops.specialize import (
    CallSite,
    Input,
    Output,
    constant,
    constant_at,
    planned,
    specialize,
    specializer,
)

from . import _jit
from ._jit import pick, sync_threads
from .conv import _NO_BIAS, ACT_CODES, _bias_act, _immutable, _skinny_gemm

# float32 products of at most this many rows by constant weights of at least this many bytes
# run as the numba skinny product over the weights as (N, K) rows, read once: OpenBLAS packs
# the weights on every call. A classifier head 2x576 -> 1024: 67-83 -> 39-53 us hot, 371 ->
# 291 us with the cache flushed; 2x1024 -> 1000: 238 -> 78 us hot; 8x768 -> 768 187 -> 122
# us. At 256 KB of weights they tie (4x256 -> 256: 5.7 against 7.5 us hot), so below 1 MiB
# BLAS keeps them
_SKINNY_MAX_ROWS = 16
_SKINNY_MIN_WEIGHTS = 1 << 20
# MatMul (A's leading axes together: its rows) by constant 2-D float32 weights of at least
# _MATMUL_MIN_WEIGHTS bytes, with _MATMUL_MIN_ROWS to _MATMUL_MAX_ROWS rows: the skinny
# product. Measured with the cache flushed before each call (the weights come from memory, as in
# a model's run; one thread): 8 rows by (768, 3072) 1412 -> 1003 us, 4 rows 1193 -> 805,
# 16 rows 1735 -> 1353, 32 rows 2492 -> 2270, 8 rows by (3072, 768) 1591 -> 1055, 32 rows
# 2276 -> 1960, 4 rows by (1024, 1024) 475 -> 281, 32 rows 1188 -> 1001. One to three rows keep
# the reference's matrix-vector products (1 row by (768, 3072): 352 against 628 us), and at
# 2.25 MiB of weights BLAS stayed ahead with the cache flushed ((384, 1536), 4-32 rows: 252-613
# against 333-717 us)
_MATMUL_MIN_ROWS = 4
_MATMUL_MAX_ROWS = 32
_MATMUL_MIN_WEIGHTS = 4 << 20


def _plain(C, n, activation, alpha, beta) -> bool:
    """Whether a call is the one this kernel computes: an activation it has, no scaling and a
    bias that is one row of the output's width (or none)."""
    return activation in ACT_CODES and alpha == 1.0 and beta == 1.0 and \
        (C is None or (C.ndim == 1 and C.shape[0] == n))


def fused_gemm(A, B, C=None, *, activation="Relu", alpha=1.0, beta=1.0, transA=0, transB=0,
               out=None):
    """FusedGemm of float32/float64 2-D A and B (see :func:`onemodel.numba.support.fused_gemm`);
    ``out``: the planned buffer to fill and return. Other calls go to the reference kernel."""
    n = B.shape[0] if transB else B.shape[1]
    if not _plain(C, n, activation, alpha, beta) or (C is not None and C.dtype != A.dtype):
        return OPS["FusedGemm"].kernel(A, B, C, activation=activation, alpha=alpha, beta=beta,
                                       transA=transA, transB=transB, out=out)
    y = OPS["Gemm"].kernel(A, B, None, transA=transA, transB=transB, out=out)
    if not y.flags.c_contiguous or y.dtype != A.dtype:  # never through a copy of y
        return OPS["FusedGemm"].kernel(A, B, C, activation=activation, transA=transA,
                                       transB=transB, out=out)
    sync_threads()
    kernel = _bias_act if _jit._parallel else _bias_act.serial
    kernel(y, _NO_BIAS[y.dtype] if C is None else C, C is not None, ACT_CODES[activation])
    return y


def gemm(A, B, C=None, *, alpha=1.0, beta=1.0, transA=0, transB=0, out=None):
    """Gemm: eagerly (a training step's Linear layers, forward and gradients), float32
    products of at least :data:`_PACKING_MIN_MACS` on one thread of an AVX-512 CPU go by
    :func:`.products.product16`, the bias row in its sums; else the reference kernel. Its
    planned call (:func:`_gemm_at`) takes the products by constant weights this plugin has,
    with the bias after (a classifier head at batch 2: OpenBLAS packs the weights on every
    call)."""
    if alpha == 1.0 and beta == 1.0 and A.dtype == B.dtype == np.float32 and \
            (C is None or C.dtype == np.float32):
        y = _packing_product(A, B, C, transA, transB, out)
        if y is not None:
            return y
    return OPS["Gemm"].kernel(A, B, C, alpha=alpha, beta=beta, transA=transA, transB=transB,
                              out=out)


# An eager float32 Gemm of at least this many multiply-adds goes by products.product16 on one
# thread (with more, BLAS's threads; the kernel is serial). The MLP 784-256-256-10's products
# at batch 64, one thread, medians (Emerald Rapids): OpenBLAS 667 us a step, PyTorch 517, these
# 549; 64 x 256 x 10 (164K) took 11.7 us against BLAS's 5.1
_PACKING_MIN_MACS = 1 << 20
# and at least this many rows and columns: a panel is 32 columns wide (x @ W.T computed as
# (W @ x.T).T: 32 rows of x), so a matrix-vector product would be mostly padding
_PACKING_MIN_SIDE = 8
_NO_ROW = np.zeros(0, np.float32)


def _flat(s: np.ndarray):
    """A 2-D array as (its elements in one contiguous run, row step, column step), from the
    array or its transpose without a copy where either is C-contiguous."""
    if s.flags.c_contiguous:
        return s.reshape(-1), s.shape[1], 1
    if s.flags.f_contiguous:
        return s.T.reshape(-1), 1, s.shape[0]
    return np.ascontiguousarray(s).reshape(-1), s.shape[1], 1


def _packing_product(A, B, C, trans_a, trans_b, out):
    """``op(A) @ op(B) (+ C)`` by :func:`.products.product16` where it applies (see
    :func:`gemm`), else None."""
    if A.ndim != 2 or B.ndim != 2:
        return None
    m, k = A.shape[::-1] if trans_a else A.shape
    k2, n = B.shape[::-1] if trans_b else B.shape
    if k != k2 or m * n * k < _PACKING_MIN_MACS or min(m, n) < _PACKING_MIN_SIDE or \
            (C is not None and (C.ndim != 1 or C.shape[0] != n)):
        return None
    if out is not None and (out.shape != (m, n) or out.dtype != np.float32 or
                            not out.flags.c_contiguous or not out.flags.writeable or
                            np.may_share_memory(out, A) or np.may_share_memory(out, B)):
        return None  # (numpy copies where out overlaps an operand; the kernel would not)
    sync_threads()
    if _jit._parallel:
        return None
    from . import _simd, products

    if not _simd.host_has_avx512():
        return None
    af, ar, ac = _flat(A)
    bf, br, bc = _flat(B)
    sam, sak = (ac, ar) if trans_a else (ar, ac)
    sbk, sbn = (bc, br) if trans_b else (br, bc)
    y = np.empty((m, n), np.float32) if out is None else out
    bias = _NO_ROW if C is None else np.ascontiguousarray(C)
    if trans_b and not trans_a and m < n:  # x @ W.T, fewer rows than W: as (W @ x.T).T
        products.product16(bf, sbn, sbk, af, sak, sam, n, m, k, y.reshape(-1), bias,
                           C is not None, True)
    else:
        products.product16(af, sam, sak, bf, sbk, sbn, m, n, k, y.reshape(-1), bias,
                           C is not None, False)
    return y


@specializer(gemm)
def _gemm_at(site: CallSite):
    """An unscaled float32 Gemm by constant weights planned as FusedGemm without an
    activation (:func:`_planned_gemm`: the panels, the skinny product or BLAS, then the bias
    row); every other Gemm keeps the reference's planned call."""
    attrs, out_shape = dict(site.attrs), site.out_shapes[0]
    b = site.values[1] if len(site.values) > 1 else None
    if isinstance(b, np.ndarray) and out_shape is not None and len(out_shape) == 2 and \
            _plain(None, 0, "", attrs.get("alpha", 1.0), attrs.get("beta", 1.0)) and (
                _gemm_panels_fit(site, attrs, b, out_shape) or
                _rows_by_k(site, attrs, out_shape) is not None):
        planned = _planned_gemm(site, attrs, "")
        if planned is not None:
            return planned
    return specialize(OPS["Gemm"].kernel, site)


@specializer(fused_gemm)
def _fused_gemm_at(site: CallSite):
    """:func:`_planned_gemm` of the node's activation."""
    attrs = dict(site.attrs)
    activation = attrs.pop("activation", "Relu")
    if activation == "":
        return None
    return _planned_gemm(site, attrs, activation)


def _planned_gemm(site: CallSite, attrs: dict, activation: str):
    """The product (the panels, the skinny product, or the reference Gemm's specialized call
    without the bias), then the bias and activation pass; inputs of other shapes or dtypes
    than planned take the generic call."""
    shapes, dtypes = site.shapes, site.dtypes
    dtype = dtypes[0]
    c_shape = shapes[2] if len(shapes) > 2 else None
    out_shape = site.out_shapes[0]
    if dtype not in _NO_BIAS or out_shape is None or len(out_shape) != 2 or \
            any(d is not None and d != dtype for d in dtypes) or \
            not _plain(None, 0, activation, attrs.get("alpha", 1.0), attrs.get("beta", 1.0)) or \
            c_shape not in (None, (out_shape[1],)):
        return None
    product = specialize(OPS["Gemm"].kernel, replace(site, attrs=attrs))
    if product is None:
        return None
    a_shape, b_shape, act, generic = shapes[0], shapes[1], ACT_CODES[activation], site.generic
    has_bias, no_bias = c_shape is not None, _NO_BIAS[dtype]
    b = site.values[1] if len(site.values) > 1 else None
    trans_b = attrs.get("transB", 0)
    rows_by_k = _rows_by_k(site, attrs, out_shape)
    panels_fit = _gemm_panels_fit(site, attrs, b, out_shape)
    # the plan's own bias as the contiguous row the kernels take (none: no_bias), else None
    c_const = site.values[2] if has_bias else no_bias
    if not (isinstance(c_const, np.ndarray) and c_const.dtype == dtype and c_const.ndim == 1
            and c_const.flags.c_contiguous):
        c_const = None
    if panels_fit and act in (0, ACT_CODES["Relu"]) and (
            not has_bias or (c_const is not None and _immutable(c_const))):
        return _whole_on_panels(b, trans_b, a_shape, out_shape, c_const if has_bias else None,
                                act, generic)
    if panels_fit:
        panel = _panel_product(b, trans_b, a_shape, out_shape,
                               lambda A, B, out=None, blas=product: blas(A, B, None, out=out))

        def product(A, B, C=None, out=None):  # (C is None: the bias comes after)
            return panel(A, B, out=out)
    elif rows_by_k is not None:
        product = _skinny_product(rows_by_k, site.values[1], a_shape, out_shape, product)
    # calls with that bias run the epilogue's machine code bound at the first (_jit.entry)
    bound = [None]

    def fused_gemm_at(A, B, C=None, out=None):
        if A.shape != a_shape or B.shape != b_shape or A.dtype != dtype or B.dtype != dtype or \
                (C is None) == has_bias or (has_bias and (C.shape != c_shape or C.dtype != dtype)):
            return generic(A, B, C, out=out)
        y = product(A, B, None, out=out)
        if not y.flags.c_contiguous:  # never through a copy of y
            return generic(A, B, C, out=out)
        sync_threads()
        bias = C if has_bias else no_bias
        if _jit._parallel or y.shape != out_shape or y.dtype != dtype or bias is not c_const:
            (_bias_act if _jit._parallel else _bias_act.serial)(y, bias, has_bias, act)
        else:  # the plan's own bias (or none) and an output of the planned shape: types fixed
            (bound[0] or _jit.bind(bound, _bias_act.serial, (y, bias, has_bias, act)))(
                y, bias, has_bias, act)
        return y
    return fused_gemm_at


def _whole_on_panels(b, trans_b, a_shape, out_shape, c_const, act, generic):
    """A FusedGemm (or Gemm) of the plan's own bias (an immutable row, or none) and no
    activation or Relu as one call of the panels: the sums start from the bias and the Relu is
    applied to each row block as it is stored (the traced MLP at batch 1: two numba calls a
    layer were one each). Any other bias goes to the generic call."""
    panel = _panel_product(b, trans_b, a_shape, out_shape,
                           lambda A, B, out=None: generic(A, B, c_const, out=out), c_const,
                           relu=act == ACT_CODES["Relu"])

    def fused_gemm_at(A, B, C=None, out=None):
        if C is not c_const:
            return generic(A, B, C, out=out)
        return panel(A, B, out=out)

    def direct(known, out):  # the panels' own, with the plan's bias (or none)
        if not constant_at(known, 2, c_const):
            return None
        return panel.direct(known[:2], out)
    fused_gemm_at.direct = direct
    return fused_gemm_at


def _rows_by_k(site: CallSite, attrs: dict, out_shape):
    """The constant weights as contiguous (N, K) rows when the product suits the skinny
    kernel (float32, A not transposed, few rows, large constant weights), else None. With
    transB the weights already are those rows (no copy). Else they are copied once, here, and
    only from weights nothing changes in place, so the copy cannot go stale: a file's
    constants, or the read-only copy the gemm-weight-layout pass made of them; a caller's own
    writable array keeps BLAS, where an update in place shows in the next run."""
    b = site.values[1] if len(site.values) > 1 else None
    if not isinstance(b, np.ndarray) or b.dtype != np.float32 or site.dtypes[0] != np.float32 \
            or attrs.get("transA", 0) or b.ndim != 2 or out_shape[0] > _SKINNY_MAX_ROWS or \
            b.nbytes < _SKINNY_MIN_WEIGHTS:
        return None
    if attrs.get("transB", 0):
        return b if b.flags.c_contiguous else None
    if _immutable(b):
        return _transposed(b)
    if not b.flags.writeable and b.base is None:  # a pass's own read-only copy: one per plan
        rows = np.ascontiguousarray(b.T)
        rows.flags.writeable = False
        return rows
    return None


# (id(weights), kind) -> (a weak reference to them, their (N, K) copy or packed panels): one of
# each kind per immutable weight array (a file's), shared by every plan (a session planning for
# several shapes would otherwise copy each large weight once per plan); an entry goes when its
# weights do. A re-entrant lock: a garbage-collection pass inside the locked section may
# finalize other weights, whose _forget then runs in the same thread
_COPIES: dict[tuple, tuple] = {}
_COPIES_LOCK = threading.RLock()


def _transposed(b: np.ndarray) -> np.ndarray:
    """``b.T`` as a contiguous, read-only array, made once per ``b``, which must be immutable
    (:func:`conv._immutable`: a read-only view of bytes, as a file's constants are), so the copy
    cannot go stale."""
    def rows(b):
        copy = np.ascontiguousarray(b.T)
        copy.flags.writeable = False
        return copy
    return _once(b, "rows", rows)


def _once(b: np.ndarray, kind: str, make):
    """``make(b)``, made once per immutable ``b`` and ``kind`` and shared by every plan (see
    _COPIES)."""
    key = (id(b), kind)
    got = _COPIES.get(key)
    if got is not None and got[0]() is b:
        return got[1]
    derived = make(b)  # outside the lock: plans of other weights need not wait
    with _COPIES_LOCK:
        got = _COPIES.get(key)
        if got is not None and got[0]() is b:  # another thread made it meanwhile
            return got[1]
        _COPIES[key] = (weakref.ref(b), derived)
    weakref.finalize(b, _forget, key, derived)
    return derived


def _forget(key: tuple, derived: np.ndarray) -> None:
    with _COPIES_LOCK:
        got = _COPIES.get(key)
        if got is not None and got[1] is derived:  # not a later array's entry under the same id
            del _COPIES[key]


def _skinny_product(w, b_const, a_shape, out_shape, blas_product):
    """``A @ B`` into the output (C-contiguous, (rows, N)) by :func:`conv._skinny_gemm` over
    ``w`` (B's (N, K) rows); another B than the planned constant goes to ``blas_product``, and so
    does every call when the planned shapes do not agree (A's last axis is not K, or the output
    is not A's leading axes by N): the kernel reads and writes unchecked."""
    n = out_shape[-1]
    if a_shape[-1] != w.shape[1] or tuple(out_shape) != (*a_shape[:-1], w.shape[0]):
        return blas_product

    rows = (math.prod(a_shape[:-1]), a_shape[-1])  # A's leading axes together (MatMul's)

    def skinny(A, B, C=None, out=None):
        if B is not b_const or A.shape != a_shape or A.dtype != np.float32:
            return blas_product(A, B, C, out=out)
        y = np.empty(out_shape, A.dtype) if out is None else out
        if y.shape != out_shape or y.dtype != A.dtype or not y.flags.c_contiguous:
            return blas_product(A, B, C, out=out)
        sync_threads()
        (_skinny_gemm if _jit._parallel else _skinny_gemm.serial)(
            w, np.ascontiguousarray(A).reshape(rows), y.reshape(y.size), 1, n)
        return y
    return skinny


def matmul(A, B, *, out=None):
    """MatMul: the reference kernel. Its planned call (:func:`_matmul_at`) takes the skinny
    product for a few rows by large constant weights."""
    return OPS["MatMul"].kernel(A, B, out=out)


@specializer(matmul)
def _matmul_at(site: CallSite):
    """The reference MatMul's planned call, or the skinny product for float32 A of
    _MATMUL_MIN_ROWS to _MATMUL_MAX_ROWS rows by a constant 2-D B of at least
    _MATMUL_MIN_WEIGHTS bytes that nothing can change in place (a file's weights); other inputs
    than planned take the reference's call."""
    reference = specialize(OPS["MatMul"].kernel, site)
    if reference is None:
        return None
    a_shape, out_shape = site.shapes[0], site.out_shapes[0]
    b = site.values[1] if len(site.values) > 1 else None
    if _panels_fit(site, b):
        return _panel_product(b, False, a_shape, out_shape, reference)
    if not isinstance(b, np.ndarray) or b.ndim != 2 or b.dtype != np.float32 or \
            site.dtypes[0] != np.float32 or a_shape is None or len(a_shape) < 2 or \
            out_shape is None or b.nbytes < _MATMUL_MIN_WEIGHTS or \
            not _MATMUL_MIN_ROWS <= math.prod(a_shape[:-1]) <= _MATMUL_MAX_ROWS or \
            not _immutable(b) or a_shape[-1] != b.shape[0] or \
            tuple(out_shape) != (*a_shape[:-1], b.shape[1]):
        return reference
    product = _skinny_product(_transposed(b), b, a_shape, out_shape,
                              lambda A, B, C=None, out=None: reference(A, B, out=out))
    return lambda A, B, out=None: product(A, B, None, out=out)


# FusedMatMul's activations: the convolutions' codes and Gelu, which only _bias_act has
MATMUL_ACT_CODES = {**ACT_CODES, "Gelu": 7}


def fused_matmul(A, B, C=None, *, activation="", out=None):
    """FusedMatMul (see :func:`onemodel.numba.support.fused_matmul`): the reference MatMul's
    product, then the bias row and the activation in one numba pass over it (``_bias_act``);
    other calls go to the reference kernel."""
    act = MATMUL_ACT_CODES.get(activation)
    n = B.shape[-1]
    if act is None or A.dtype != B.dtype or A.dtype not in _NO_BIAS or B.ndim != 2 or \
            (C is not None and (C.shape != (n,) or C.dtype != A.dtype)):
        return OPS["FusedMatMul"].kernel(A, B, C, activation=activation, out=out)
    y = OPS["MatMul"].kernel(A, B, out=out)
    if not y.flags.c_contiguous or y.dtype != A.dtype:  # never through a copy of y
        return OPS["FusedMatMul"].kernel(A, B, C, activation=activation, out=out)
    sync_threads()
    pick(_bias_act)(y.reshape(-1, n), _NO_BIAS[y.dtype] if C is None else C, C is not None, act)
    return y


@specializer(fused_matmul)
def _fused_matmul_at(site: CallSite):
    """The MatMul's own planned call (:func:`_matmul_at`: the panels, the skinny product or
    the reference's), then the bias and activation pass over the product as (rows, N). Inputs
    of other shapes or dtypes than planned take the generic call."""
    act = MATMUL_ACT_CODES.get(site.attrs.get("activation", ""))
    shapes, dtypes, out_shape = site.shapes, site.dtypes, site.out_shapes[0]
    dtype = dtypes[0]
    if act is None or dtype not in _NO_BIAS or out_shape is None or None in out_shape or \
            len(shapes) < 2 or shapes[0] is None or shapes[1] is None or \
            any(d is not None and d != dtype for d in dtypes):
        return None
    n = out_shape[-1]
    c_shape = shapes[2] if len(shapes) > 2 else None
    if c_shape not in (None, (n,)):
        return None
    a_shape, b_shape, rows, generic = shapes[0], shapes[1], math.prod(out_shape[:-1]), site.generic
    has_bias, no_bias = c_shape is not None, _NO_BIAS[dtype]
    c_const = site.values[2] if has_bias else no_bias
    if not (isinstance(c_const, np.ndarray) and c_const.dtype == dtype and c_const.ndim == 1
            and c_const.flags.c_contiguous):
        c_const = None
    mm_site = replace(site, shapes=shapes[:2], dtypes=dtypes[:2], values=site.values[:2],
                      attrs={}, generic=matmul)
    b = site.values[1] if len(site.values) > 1 else None
    if act == 0 and has_bias and c_const is not None and _immutable(c_const) and \
            _panels_fit(mm_site, b):
        # the bias alone: the panels' sums start from it, no pass after (the plan's own bias
        # only; any other call, the generic one)
        panel = _panel_product(b, False, a_shape, out_shape,
                               lambda A, B, out=None: generic(A, B, c_const, out=out), c_const)

        def biased_matmul_at(A, B, C=None, out=None):
            if C is not c_const:
                return generic(A, B, C, out=out)
            return panel(A, B, out=out)

        def direct(known, out):  # the panels' own, with the plan's bias
            if not constant_at(known, 2, c_const):
                return None
            return panel.direct(known[:2], out)
        biased_matmul_at.direct = direct
        return biased_matmul_at
    product = _matmul_at(mm_site)
    if product is None:
        return None
    bound = [None]  # the epilogue's machine code (_jit.entry), bound at the first call

    def fused_matmul_at(A, B, C=None, out=None):
        if A.shape != a_shape or B.shape != b_shape or A.dtype != dtype or B.dtype != dtype or \
                (C is None) == has_bias or (has_bias and (C.shape != c_shape or C.dtype != dtype)):
            return generic(A, B, C, out=out)
        y = product(A, B, out=out)
        if y.shape != out_shape or y.dtype != dtype or not y.flags.c_contiguous:
            return generic(A, B, C, out=out)  # never through a copy of y
        sync_threads()
        bias, y2 = C if has_bias else no_bias, y.reshape(rows, n)
        if _jit._parallel or bias is not c_const:
            (_bias_act if _jit._parallel else _bias_act.serial)(y2, bias, has_bias, act)
        else:  # the plan's own bias (or none): the types are fixed
            (bound[0] or _jit.bind(bound, _bias_act.serial, (y2, bias, has_bias, act)))(
                y2, bias, has_bias, act)
        return y

    def direct(known, out):  # the product's kernels, then the epilogue's, with the plan's bias
        offer = getattr(product, "direct", None)
        sync_threads()
        if offer is None or c_const is None or _jit._parallel or len(known) < 2 or \
                not constant_at(known, 2, c_const if has_bias else None) or \
                not planned(out, out_shape, dtype):
            return None
        first = offer(known[:2], out)
        if first is None:
            return None
        return (*(first if isinstance(first, tuple) else (first,)),
                _jit.direct(_bias_act.serial, (Output((rows, n)), c_const, has_bias, act),
                            known, out))
    fused_matmul_at.direct = direct
    return fused_matmul_at


def _panels_fit(site: CallSite, b) -> bool:
    """Whether a planned MatMul goes by :mod:`.panels`: float32 A with its leading axes as
    rows by a constant 2-D float32 B nothing can change in place, on one thread, where
    :func:`panels.fits` says."""
    from . import panels

    a_shape, out_shape = site.shapes[0], site.out_shapes[0]
    sync_threads()
    return isinstance(b, np.ndarray) and b.ndim == 2 and b.dtype == np.float32 and \
        site.dtypes[0] == np.float32 and a_shape is not None and len(a_shape) >= 2 and \
        None not in a_shape and out_shape is not None and a_shape[-1] == b.shape[0] and \
        tuple(out_shape) == (*a_shape[:-1], b.shape[1]) and not _jit._parallel and \
        _immutable(b) and panels.fits(math.prod(a_shape[:-1]), b.shape[0], b.shape[1])


def _gemm_panels_fit(site: CallSite, attrs: dict, b, out_shape) -> bool:
    """Whether a planned FusedGemm's product goes by :mod:`.panels`: float32 A (not
    transposed, no scaling) by a constant 2-D float32 B (or its transpose) nothing can change
    in place (a file's, or a pass's frozen copy), on one thread, where :func:`panels.fits`
    says."""
    from . import panels

    a_shape = site.shapes[0]
    sync_threads()
    if not isinstance(b, np.ndarray) or b.ndim != 2 or b.dtype != np.float32 or \
            site.dtypes[0] != np.float32 or attrs.get("transA", 0) or \
            attrs.get("alpha", 1.0) != 1.0 or a_shape is None or len(a_shape) != 2 or \
            None in a_shape or _jit._parallel or not _immutable(b):
        return False
    k, n = b.shape[::-1] if attrs.get("transB", 0) else b.shape
    return a_shape[1] == k and tuple(out_shape) == (a_shape[0], n) and \
        panels.fits(a_shape[0], k, n)


def _panel_product(b, transposed, a_shape, out_shape, reference, bias=None, relu=False):
    """The planned call of ``A @ b`` (``A @ b.T`` when ``transposed``; ``+ bias``, an
    immutable row, when given; then max(., 0) with ``relu``) by :func:`panels.product` over
    the weights packed once (shared by every plan of ``b``); another B, or an A or ``out`` of
    another shape, dtype or layout than planned, goes to ``reference``."""
    from . import panels

    width = panels.width()
    product = panels.kernel(width)
    bp = _once(b, f"panels of the transpose, {width} wide",
               lambda b: panels.pack(b.T, width)) if transposed \
        else _once(b, f"panels, {width} wide", lambda b: panels.pack(b, width))
    rows = (math.prod(a_shape[:-1]), a_shape[-1])
    n = out_shape[-1]
    flat = len(a_shape) == 2  # A and the output are the kernel's (M, K) and (M, N) already
    cp = panels.pack_row(bias, n, width)
    dtype = np.dtype(np.float32)
    bound = [None]  # the kernel's machine code (_jit.entry), bound at the first call

    def panels_at(A, B, out=None):
        if B is not b or A.shape != a_shape or A.dtype != dtype or (out is not None and (
                out.shape != out_shape or out.dtype != dtype or not out.flags.carray)):
            return reference(A, B, out=out)
        if not A.flags.c_contiguous:
            A = np.ascontiguousarray(A)
        y = np.empty(out_shape, dtype) if out is None else out
        a2, y2 = (A, y) if flat else (A.reshape(rows), y.reshape(rows[0], n))
        (bound[0] or _jit.bind(bound, product, (a2, bp, n, y2, cp, relu)))(a2, bp, n, y2, cp,
                                                                            relu)
        return y

    def direct(known, out):  # the kernel, where the plan proves what the call checks
        if len(known) < 2 or not (constant(known[1], b) and planned(known[0], a_shape, dtype)
                                  and planned(out, out_shape, dtype)):
            return None
        return _jit.direct(product, (Input(0, None if flat else rows), bp, n,
                                     Output(None if flat else (rows[0], n)), cp, relu),
                           known, out)
    panels_at.direct = direct
    return panels_at
