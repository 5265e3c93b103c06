"""Eight float32 lanes as one value in numba kernels: ``F32x8``, held in a vector register.

Why: numba vectorizes loops, not register tiles. A convolution's inner loop that keeps twelve
accumulators (three output pixels by 32 output channels) across every tap must hold them in
registers; written as 96 scalars, LLVM's SLP vectorizer left them scalar (3.3 GMAC/s in a
scratch timing), written with these it emits ``vfmadd231ps`` on ymm registers (44 GMAC/s on
the same 2x16x15x15 -> 64 3x3 convolution). Each function here is one LLVM instruction or
intrinsic; the type has no Python value and never leaves a compiled function.

- ``load8(a, i)``: ``a[i:i + 8]`` (``a`` 1-D, contiguous float32; the caller keeps ``i + 8``
  within ``a``: nothing is checked).
- ``store8(a, i, v)``: ``a[i:i + 8] = v`` (the same contract).
- ``splat8(x)``: eight copies of a float32 scalar.
- ``fma8(a, b, c)``: ``a * b + c`` lane by lane, rounded once (``llvm.fma``).
- ``transpose8x8(src, s0, sstride, dst, d0, dstride)``: eight runs of eight read, transposed
  in registers, written as eight runs.
- ``add8(a, b)``: ``a + b``; ``clamp8(v, lo, hi)``: ``v`` clamped lane by lane, NaN passing
  (conv.py's Relu and Relu6, for kernels that finish their sums in registers).
- ``mul8(a, b)``: ``a * b``; ``first8(v, n, fill)``: ``v``'s first ``n`` lanes, ``fill`` in
  the rest; ``hmax8(v)``: the largest lane, NaN if one is NaN: a row's maximum over vectors.

``F32x16`` with ``load16``, ``store16``, ``splat16`` and ``fma16`` is the same for sixteen
lanes (one AVX-512 register), for kernels chosen only where :func:`host_has_avx512` says the
CPU has them and numba's code generation keeps them whole (``_jit.WIDE_VECTORS``). Besides:

- ``max16(a, v)``: :func:`max8`'s running maximum on sixteen lanes; ``larger16(a, v)``: ``v``
  where ``v > a``, ``a`` elsewhere (one ``vmaxps``: a NaN in ``v`` is dropped), for kernels
  that check for NaN apart: ``add16(a, b)`` and ``has_nan16(v)``; ``clamp16(v, lo, hi)``.
- ``load16_masked(a, i, lo, hi, fill)``: lane ``l`` is ``a[i + l]`` where ``lo <= l < hi``,
  ``fill`` elsewhere; the lanes outside are not read, so ``i`` may point before ``a`` or
  ``i + 16`` past it (AVX-512's masked loads). ``store16_masked(a, i, n, v)`` writes lanes
  ``l < n`` only.
- ``evens16(a, b)`` and ``odds16(a, b)``: the even (odd) lanes of the 32 lanes ``a`` then
  ``b``; ``next16(a, b)``: lanes 1 to 15 of ``a`` then lane 0 of ``b``.
"""

from __future__ import annotations

import functools

from llvmlite import ir

from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

LANES = 8


@functools.lru_cache(maxsize=1)
def host_has_fma() -> bool:
    """Whether this CPU has AVX2 and FMA: kernels built on these vectors are chosen only then
    (without them each ``fma8`` becomes eight calls)."""
    from llvmlite import binding

    features = binding.get_host_cpu_features()
    return bool(features.get("avx2")) and bool(features.get("fma"))


@functools.lru_cache(maxsize=1)
def host_has_avx512() -> bool:
    """Whether this CPU has AVX-512 (F and VL) and FMA, and numba generates code that keeps
    512-bit vectors whole (``_jit.WIDE_VECTORS``): the sixteen-lane kernels are chosen only
    then. Without the latter, LLVM splits each ``fma16`` into two 256-bit halves."""
    from llvmlite import binding

    from . import _jit

    features = binding.get_host_cpu_features()
    return host_has_fma() and bool(features.get("avx512f")) and \
        bool(features.get("avx512vl")) and _jit.WIDE_VECTORS


class F32x8(types.Type):
    """The numba type of eight float32 lanes (LLVM ``<8 x float>``)."""

    def __init__(self):
        super().__init__(name="F32x8")


f32x8 = F32x8()
_VEC = ir.VectorType(ir.FloatType(), LANES)


@register_model(F32x8)
class _F32x8Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _VEC)


class F32x16(types.Type):
    """The numba type of sixteen float32 lanes (LLVM ``<16 x float>``)."""

    def __init__(self):
        super().__init__(name="F32x16")


f32x16 = F32x16()
_VEC16 = ir.VectorType(ir.FloatType(), 16)


@register_model(F32x16)
class _F32x16Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _VEC16)


def _float32_array(arr) -> bool:
    """A 1-D C-contiguous float32 array: its elements are one run from its data pointer."""
    return isinstance(arr, types.Array) and arr.dtype == types.float32 and arr.ndim == 1 and \
        arr.layout == "C"


def _address(context, builder, aryty, ary, index, vec=_VEC):
    data = context.make_array(aryty)(context, builder, ary).data
    return builder.bitcast(builder.gep(data, [index]), vec.as_pointer())


@intrinsic
def load8(typingctx, arr, index):
    """``arr[index:index + 8]`` as one vector (unaligned load)."""
    if not _float32_array(arr) or not isinstance(index, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        return builder.load(_address(context, builder, sig.args[0], args[0], args[1]), align=4)
    return f32x8(arr, index), codegen


@intrinsic
def store8(typingctx, arr, index, vec):
    """``arr[index:index + 8] = vec`` (unaligned store)."""
    if not _float32_array(arr) or not isinstance(index, types.Integer) or vec != f32x8:
        return None

    def codegen(context, builder, sig, args):
        builder.store(args[2], _address(context, builder, sig.args[0], args[0], args[1]),
                      align=4)
        return context.get_dummy_value()
    return types.void(arr, index, vec), codegen


@intrinsic
def splat8(typingctx, x):
    """Eight copies of the float32 ``x``."""
    if x != types.float32:
        return None

    def codegen(context, builder, sig, args):
        i32 = ir.IntType(32)
        one = builder.insert_element(ir.Constant(_VEC, ir.Undefined), args[0],
                                     ir.Constant(i32, 0))
        return builder.shuffle_vector(one, ir.Constant(_VEC, ir.Undefined),
                                      ir.Constant(ir.VectorType(i32, LANES), [0] * LANES))
    return f32x8(types.float32), codegen


@intrinsic
def fma8(typingctx, a, b, c):
    """``a * b + c`` in each lane, rounded once."""
    if not (a == b == c == f32x8):
        return None

    def codegen(context, builder, sig, args):
        fnty = ir.FunctionType(_VEC, [_VEC, _VEC, _VEC])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.fma.v8f32")
        return builder.call(fn, list(args))
    return f32x8(f32x8, f32x8, f32x8), codegen


@intrinsic
def add8(typingctx, a, b):
    """``a + b`` lane by lane."""
    if not (a == b == f32x8):
        return None

    def codegen(context, builder, sig, args):
        return builder.fadd(args[0], args[1])
    return f32x8(f32x8, f32x8), codegen


@intrinsic
def mul8(typingctx, a, b):
    """``a * b`` lane by lane."""
    if not (a == b == f32x8):
        return None

    def codegen(context, builder, sig, args):
        return builder.fmul(args[0], args[1])
    return f32x8(f32x8, f32x8), codegen


@intrinsic
def first8(typingctx, v, n, fill):
    """``v`` in lanes ``l < n``, the float32 ``fill`` in the others: a row's last vector with
    the lanes past its end set aside."""
    if v != f32x8 or not isinstance(n, types.Integer) or fill != types.float32:
        return None

    def codegen(context, builder, sig, args):
        v_, n_, fill_ = args
        i64 = ir.IntType(64)
        lanes = ir.Constant(ir.VectorType(i64, LANES), list(range(LANES)))
        count = _splat(builder, context.cast(builder, n_, sig.args[1], types.int64),
                       ir.VectorType(i64, LANES))
        return builder.select(builder.icmp_signed("<", lanes, count), v_,
                              _splat(builder, fill_, _VEC))
    return f32x8(f32x8, n, types.float32), codegen


@intrinsic
def hmax8(typingctx, v):
    """The largest of the eight lanes, NaN if one is NaN (:func:`max8` over the lanes)."""
    if v != f32x8:
        return None

    def codegen(context, builder, sig, args):
        i32 = ir.IntType(32)
        m = builder.extract_element(args[0], ir.Constant(i32, 0))
        for lane in range(1, LANES):
            x = builder.extract_element(args[0], ir.Constant(i32, lane))
            take = builder.or_(builder.fcmp_ordered(">", x, m), builder.fcmp_unordered("uno", x, x))
            m = builder.select(take, x, m)
        return m
    return types.float32(f32x8), codegen


@intrinsic
def clamp8(typingctx, v, lo, hi):
    """``lo`` in the lanes where ``v < lo``, ``hi`` where ``v > hi``, ``v`` elsewhere: NaN and
    -0.0 pass. conv.py's Relu is (0, +inf), its Relu6 (0, 6), no activation (-inf, +inf): one
    branch-free finish for the three (a branch per store made each tile kernel three)."""
    if not (v == lo == hi == f32x8):
        return None

    def codegen(context, builder, sig, args):
        return _clamped(builder, *args)
    return f32x8(f32x8, f32x8, f32x8), codegen


def _clamped(builder, v, lo, hi):
    v = builder.select(builder.fcmp_ordered("<", v, lo), lo, v)
    return builder.select(builder.fcmp_ordered(">", v, hi), hi, v)


@intrinsic
def max8(typingctx, a, v):
    """``v`` in the lanes where it is greater than ``a`` or NaN, ``a`` elsewhere: a running
    maximum in which NaN wins and stays, and ties keep the earlier value (the pooling
    kernels' ``a = v if (v > a) | (v != v) else a``, one compare and select a lane)."""
    if not (a == v == f32x8):
        return None

    def codegen(context, builder, sig, args):
        a_, v_ = args
        take = builder.or_(builder.fcmp_ordered(">", v_, a_), builder.fcmp_unordered("uno", v_, v_))
        return builder.select(take, v_, a_)
    return f32x8(f32x8, f32x8), codegen


@intrinsic
def load16(typingctx, arr, index):
    """``arr[index:index + 16]`` as one vector (unaligned load)."""
    if not _float32_array(arr) or not isinstance(index, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        return builder.load(_address(context, builder, sig.args[0], args[0], args[1], _VEC16),
                            align=4)
    return f32x16(arr, index), codegen


@intrinsic
def store16(typingctx, arr, index, vec):
    """``arr[index:index + 16] = vec`` (unaligned store)."""
    if not _float32_array(arr) or not isinstance(index, types.Integer) or vec != f32x16:
        return None

    def codegen(context, builder, sig, args):
        builder.store(args[2], _address(context, builder, sig.args[0], args[0], args[1],
                                        _VEC16), align=4)
        return context.get_dummy_value()
    return types.void(arr, index, vec), codegen


@intrinsic
def splat16(typingctx, x):
    """Sixteen copies of the float32 ``x``."""
    if x != types.float32:
        return None

    def codegen(context, builder, sig, args):
        i32 = ir.IntType(32)
        one = builder.insert_element(ir.Constant(_VEC16, ir.Undefined), args[0],
                                     ir.Constant(i32, 0))
        return builder.shuffle_vector(one, ir.Constant(_VEC16, ir.Undefined),
                                      ir.Constant(ir.VectorType(i32, 16), [0] * 16))
    return f32x16(types.float32), codegen


@intrinsic
def fma16(typingctx, a, b, c):
    """``a * b + c`` in each of sixteen lanes, rounded once."""
    if not (a == b == c == f32x16):
        return None

    def codegen(context, builder, sig, args):
        fnty = ir.FunctionType(_VEC16, [_VEC16, _VEC16, _VEC16])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.fma.v16f32")
        return builder.call(fn, list(args))
    return f32x16(f32x16, f32x16, f32x16), codegen


@intrinsic
def max16(typingctx, a, v):
    """:func:`max8` on sixteen lanes: NaN wins and stays, ties keep ``a``."""
    if not (a == v == f32x16):
        return None

    def codegen(context, builder, sig, args):
        a_, v_ = args
        take = builder.or_(builder.fcmp_ordered(">", v_, a_), builder.fcmp_unordered("uno", v_, v_))
        return builder.select(take, v_, a_)
    return f32x16(f32x16, f32x16), codegen


@intrinsic
def larger16(typingctx, a, v):
    """``v`` where ``v > a``, ``a`` elsewhere: one ``vmaxps`` (x86's operand order), which
    keeps a NaN of ``a`` and drops one of ``v``."""
    if not (a == v == f32x16):
        return None

    def codegen(context, builder, sig, args):
        a_, v_ = args
        return builder.select(builder.fcmp_ordered(">", v_, a_), v_, a_)
    return f32x16(f32x16, f32x16), codegen


@intrinsic
def add16(typingctx, a, b):
    """``a + b`` lane by lane."""
    if not (a == b == f32x16):
        return None

    def codegen(context, builder, sig, args):
        return builder.fadd(args[0], args[1])
    return f32x16(f32x16, f32x16), codegen


@intrinsic
def clamp16(typingctx, v, lo, hi):
    """:func:`clamp8` on sixteen lanes."""
    if not (v == lo == hi == f32x16):
        return None

    def codegen(context, builder, sig, args):
        return _clamped(builder, *args)
    return f32x16(f32x16, f32x16, f32x16), codegen


@intrinsic
def has_nan16(typingctx, v):
    """Whether a lane of ``v`` is NaN."""
    if v != f32x16:
        return None

    def codegen(context, builder, sig, args):
        nan = builder.fcmp_unordered("uno", args[0], args[0])
        bits = builder.bitcast(nan, ir.IntType(16))
        return builder.icmp_unsigned("!=", bits, ir.Constant(ir.IntType(16), 0))
    return types.boolean(f32x16), codegen


def _splat(builder, value, vecty):
    i32 = ir.IntType(32)
    one = builder.insert_element(ir.Constant(vecty, ir.Undefined), value, ir.Constant(i32, 0))
    return builder.shuffle_vector(one, ir.Constant(vecty, ir.Undefined),
                                  ir.Constant(ir.VectorType(i32, vecty.count), [0] * vecty.count))


def _lanes_between(context, builder, sig, args, lo, hi):
    """The <16 x i1> mask of the lanes ``l`` with ``lo <= l < hi`` (``lo``, ``hi``: indices
    into ``args``)."""
    i32 = ir.IntType(32)
    vec = ir.VectorType(i32, 16)
    bound = [builder.trunc(context.cast(builder, args[i], sig.args[i], types.int64), i32)
             for i in (lo, hi)]
    lanes = ir.Constant(vec, list(range(16)))
    return builder.and_(builder.icmp_signed(">=", lanes, _splat(builder, bound[0], vec)),
                        builder.icmp_signed("<", lanes, _splat(builder, bound[1], vec)))


def _index(context, builder, sig, args, i):
    return context.cast(builder, args[i], sig.args[i], types.int64)


@intrinsic
def load16_masked(typingctx, arr, index, lo, hi, fill):
    """Lane ``l`` is ``arr[index + l]`` where ``lo <= l < hi``, ``fill`` elsewhere; the lanes
    outside are not read (``llvm.masked.load``)."""
    if not (_float32_array(arr) and all(isinstance(v, types.Integer) for v in (index, lo, hi))
            and fill == types.float32):
        return None

    def codegen(context, builder, sig, args):
        ptr = _address(context, builder, sig.args[0], args[0],
                       _index(context, builder, sig, args, 1), _VEC16)
        mask = _lanes_between(context, builder, sig, args, 2, 3)
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(_VEC16, [ptr.type, i32, mask.type, _VEC16])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.masked.load.v16f32.p0")
        return builder.call(fn, [ptr, ir.Constant(i32, 4), mask,
                                 _splat(builder, args[4], _VEC16)])
    return f32x16(arr, index, lo, hi, fill), codegen


@intrinsic
def store16_masked(typingctx, arr, index, n, vec):
    """``arr[index:index + n] = vec[:n]`` for ``n <= 16``; the other lanes are not written
    (``llvm.masked.store``)."""
    if not (_float32_array(arr) and isinstance(index, types.Integer)
            and isinstance(n, types.Integer) and vec == f32x16):
        return None

    def codegen(context, builder, sig, args):
        ptr = _address(context, builder, sig.args[0], args[0],
                       _index(context, builder, sig, args, 1), _VEC16)
        i32 = ir.IntType(32)
        vec = ir.VectorType(i32, 16)
        count = builder.trunc(_index(context, builder, sig, args, 2), i32)
        mask = builder.icmp_signed("<", ir.Constant(vec, list(range(16))),
                                   _splat(builder, count, vec))
        fnty = ir.FunctionType(ir.VoidType(), [_VEC16, ptr.type, i32, mask.type])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.masked.store.v16f32.p0")
        builder.call(fn, [args[3], ptr, ir.Constant(i32, 4), mask])
        return context.get_dummy_value()
    return types.void(arr, index, n, vec), codegen


def _shuffle_codegen(lanes):
    def codegen(context, builder, sig, args):
        return builder.shuffle_vector(args[0], args[1],
                                      ir.Constant(ir.VectorType(ir.IntType(32), 16), lanes))
    return codegen


@intrinsic
def evens16(typingctx, a, b):
    """The even lanes of the 32 lanes ``a`` then ``b``."""
    if not (a == b == f32x16):
        return None
    return f32x16(f32x16, f32x16), _shuffle_codegen(list(range(0, 32, 2)))


@intrinsic
def odds16(typingctx, a, b):
    """The odd lanes of the 32 lanes ``a`` then ``b``."""
    if not (a == b == f32x16):
        return None
    return f32x16(f32x16, f32x16), _shuffle_codegen(list(range(1, 32, 2)))


@intrinsic
def next16(typingctx, a, b):
    """Lanes 1 to 15 of ``a``, then lane 0 of ``b``: ``a`` moved one lane along a row."""
    if not (a == b == f32x16):
        return None
    return f32x16(f32x16, f32x16), _shuffle_codegen(list(range(1, 17)))


def _shuffled(builder, a, b, lanes):
    return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(ir.IntType(32), LANES), lanes))


def _transposed(builder, rows):
    """The 8x8 transpose of eight <8 x float> rows: three rounds of two-source shuffles."""
    lo, hi = [0, 8, 1, 9, 4, 12, 5, 13], [2, 10, 3, 11, 6, 14, 7, 15]
    t = []
    for i in range(0, 8, 2):
        t += [_shuffled(builder, rows[i], rows[i + 1], lo),
              _shuffled(builder, rows[i], rows[i + 1], hi)]
    lo, hi = [0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15]
    u = []
    for i in (0, 4):  # (t0, t2) (t1, t3), then (t4, t6) (t5, t7)
        u += [_shuffled(builder, t[i], t[i + 2], lo), _shuffled(builder, t[i], t[i + 2], hi),
              _shuffled(builder, t[i + 1], t[i + 3], lo),
              _shuffled(builder, t[i + 1], t[i + 3], hi)]
    lo, hi = [0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]
    out = [None] * 8
    for col in range(4):
        out[col] = _shuffled(builder, u[col], u[col + 4], lo)
        out[col + 4] = _shuffled(builder, u[col], u[col + 4], hi)
    return out


@intrinsic
def transpose8x8(typingctx, src, s0, sstride, dst, d0, dstride):
    """dst[d0 + c * dstride + r] = src[s0 + r * sstride + c] for r, c < 8: eight runs of eight
    read, transposed in registers, written as eight runs (channels-last to planes and back)."""
    if not (_float32_array(src) and _float32_array(dst) and all(
            isinstance(a, types.Integer) for a in (s0, sstride, d0, dstride))):
        return None

    def codegen(context, builder, sig, args):
        src_ty, _, _, dst_ty, _, _ = sig.args
        s0_, ss_, d0_, ds_ = (context.cast(builder, args[i], sig.args[i], types.int64)
                              for i in (1, 2, 4, 5))
        rows = []
        for r in range(8):
            at = builder.add(s0_, builder.mul(ss_, ir.Constant(ir.IntType(64), r)))
            rows.append(builder.load(_address(context, builder, src_ty, args[0], at), align=4))
        for c, vec in enumerate(_transposed(builder, rows)):
            at = builder.add(d0_, builder.mul(ds_, ir.Constant(ir.IntType(64), c)))
            builder.store(vec, _address(context, builder, dst_ty, args[3], at), align=4)
        return context.get_dummy_value()
    return types.void(src, s0, sstride, dst, d0, dstride), codegen
