"""float32 erf, tanh, exp and sigmoid in plain arithmetic that LLVM vectorizes: numba has no
vector libm here, and a scalar ``math.erf``/``math.tanh``/``math.exp`` per element costs 5-12
ns where these cost well under one. erf and tanh are a clamp and a rational polynomial (Eigen's
``generic_fast_erf_float`` / ``generic_fast_tanh_float`` coefficients), exp the reduction and
polynomial ``softmax`` uses. Accurate to a few float32 ulp (checked against libm on a dense
grid by the tests; exp flushes subnormal results to 0, sigmoid below -88.72); NaN passes through,
infinities give the limits. float64 callers keep libm."""

from __future__ import annotations

import numpy as np
from llvmlite import ir

from numba import njit, types
from numba.extending import intrinsic

F = np.float32


@intrinsic
def _fma(typingctx, a, b, c):
    """a * b + c rounded once, for float32 operands: LLVM's fma, one vfmadd per vector in the
    vectorized loops. Each polynomial step written as fma instead of a multiply and an add
    takes a third less time (exp32 over 196608 values: 77 -> 52 us) for the same accuracy
    (8.3e-8 against 8.1e-8 relative to libm on a dense grid)."""
    if not (a == b == c == types.float32):
        return None

    def codegen(context, builder, signature, args):
        f32 = ir.FloatType()
        fn = builder.module.declare_intrinsic("llvm.fma", [f32], ir.FunctionType(f32, [f32] * 3))
        return builder.call(fn, args)

    return types.float32(types.float32, types.float32, types.float32), codegen


_E_A1, _E_A3, _E_A5 = F(-1.60960333262415e-02), F(-2.95459980854025e-03), F(-7.34990630326855e-04)
_E_A7, _E_A9 = F(-5.69250639462346e-05), F(-2.10102402082508e-06)
_E_A11, _E_A13 = F(2.77068142495902e-08), F(-2.72614225801306e-10)
_E_B0, _E_B2, _E_B4 = F(-1.42647390514189e-02), F(-7.37332916720468e-03), F(-1.68282697438203e-03)
_E_B6, _E_B8 = F(-2.13374055278905e-04), F(-1.45660718464996e-05)
_FOUR = F(4.0)

_T_A1, _T_A3, _T_A5 = F(4.89352455891786e-03), F(6.37261928875436e-04), F(1.48572235717979e-05)
_T_A7, _T_A9 = F(5.12229709037114e-08), F(-8.60467152213735e-11)
_T_A11, _T_A13 = F(2.00018790482477e-13), F(-2.76076847742355e-16)
_T_B0, _T_B2, _T_B4 = F(4.89352518554385e-03), F(2.26843463243900e-03), F(1.18534705686654e-04)
_T_B6 = F(1.19825839466702e-06)
_T_CLAMP = F(7.90531110763549805)
_T_TINY = F(0.0004)


@njit(cache=True, inline="always")
def erf32(a):
    """erf of float32 ``a`` (NaN stays NaN: comparisons with it are false)."""
    x = F(a)
    x = _FOUR if x > _FOUR else (-_FOUR if x < -_FOUR else x)
    x2 = x * x
    p = _fma(x2, _E_A13, _E_A11)
    p = _fma(x2, p, _E_A9)
    p = _fma(x2, p, _E_A7)
    p = _fma(x2, p, _E_A5)
    p = _fma(x2, p, _E_A3)
    p = _fma(x2, p, _E_A1)
    p = x * p
    q = _fma(x2, _E_B8, _E_B6)
    q = _fma(x2, q, _E_B4)
    q = _fma(x2, q, _E_B2)
    q = _fma(x2, q, _E_B0)
    return p / q


@njit(cache=True, inline="always")
def tanh32(a):
    """tanh of float32 ``a``; below 0.0004 in magnitude tanh(a) is a itself (to the ulp).
    Multiplies and adds, not fma: rounded twice, the rational polynomial at the clamp comes
    to exactly 1, so tanh of large inputs and of inf is 1 (with fma, 4 ulp below)."""
    v = F(a)
    x = _T_CLAMP if v > _T_CLAMP else (-_T_CLAMP if v < -_T_CLAMP else v)
    x2 = x * x
    p = x2 * _T_A13 + _T_A11
    p = x2 * p + _T_A9
    p = x2 * p + _T_A7
    p = x2 * p + _T_A5
    p = x2 * p + _T_A3
    p = x2 * p + _T_A1
    p = x * p
    q = x2 * _T_B6 + _T_B4
    q = x2 * q + _T_B2
    q = x2 * q + _T_B0
    r = p / q
    return v if abs(v) < _T_TINY else r


@intrinsic
def _float32_from_bits(typingctx, bits):
    """The float32 whose bit pattern is the int32 ``bits`` (an LLVM bitcast, which vectorizes)."""
    if bits != types.int32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.int32), codegen


@intrinsic
def _bits_of_float32(typingctx, value):
    """The int32 bit pattern of the float32 ``value`` (an LLVM bitcast, which vectorizes)."""
    if value != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.int32(types.float32), codegen


_LOG2E = F(1.44269504088896341)
_LN2_HI = F(0.693359375)
_LN2_LO = F(-2.12194440e-4)
_EXP_LOW = F(-87.33654)  # below: the result would be subnormal, taken as 0
_EXP_HIGH = F(88.72283)  # above: overflow to inf
_HALF = F(0.5)
_ONE = F(1.0)
_ZERO = F(0.0)
_P0, _P1, _P2 = F(1.9875691500e-4), F(1.3981999507e-3), F(8.3334519073e-3)
_P3, _P4, _P5 = F(4.1665795894e-2), F(1.6666665459e-1), F(5.0000001201e-1)
_BIAS, _FIELD = F(127.0), F(8388608.0)  # the exponent bias, 2**23


@njit(cache=True, inline="always")
def exp_reduced(c):
    """(n, p) with exp(c) = p * 2**n for a float32 ``c`` inside exp's range: n = round(c / ln 2),
    the remainder f = c - n ln 2 in two fma steps (Cody-Waite), p = exp(f) by Cephes' degree-7
    polynomial in fma steps. The one place ``exp32`` and the softmax kernels take it from."""
    n = np.floor(_fma(c, _LOG2E, _HALF))
    f = _fma(-n, _LN2_LO, _fma(-n, _LN2_HI, c))
    p = _fma(f, _P0, _P1)
    p = _fma(p, f, _P2)
    p = _fma(p, f, _P3)
    p = _fma(p, f, _P4)
    p = _fma(p, f, _P5)
    return n, _fma(p * f, f, f) + _ONE


@njit(cache=True, inline="always")
def exp32(a):
    """exp of float32 ``a``: Cody-Waite reduction, Cephes' degree-7 polynomial (about 2e-7
    relative) and 2**n from its exponent bits (as in ``softmax``); subnormal results are 0."""
    v = F(a)
    low = v < _EXP_LOW
    high = v > _EXP_HIGH
    c = _EXP_LOW if low else (_EXP_HIGH if high else v)
    n, p = exp_reduced(c)
    # p * 2**n by adding n to p's exponent field: the result stays normal, as p is at least
    # 1 where n is -126 (c is clamped at -126 ln 2) and below 1 where n is 128. Two 2**n
    # halves multiplied in (n reaches 128, past float32's exponents) gave the same bits on
    # every float32 from -100 to 100 and both edges, in 1.25x the time (196608 values: 94.7
    # against 76.7 us; docs/benchmarks.md, "Fourteenth round")
    # a NaN n (a NaN input) is not converted: its int32 would be undefined (LLVM's poison)
    r = _float32_from_bits(np.int32(_bits_of_float32(p)
                                    + (np.int32(n if n == n else _ZERO) << np.int32(23))))
    return _ZERO if low else (np.float32(np.inf) if high else r)


@njit(cache=True, inline="always")
def sigmoid32(a):
    """1 / (1 + exp(-a)) for float32 ``a``, as written: where exp(-a) overflows to inf (a below
    -88.72) the result is 0, the float32 sigmoid there being subnormal; elsewhere the relative
    error is exp32's. NaN stays NaN. (Through exp(-|a|) and e / (1 + e) below zero, a SiLU
    over 196608 values took 1.25x the time.)"""
    return _ONE / (_ONE + exp32(-F(a)))


# Numerical Recipes' erfcc: erfc(z) = t * exp(-z*z + P(t)), t = 1 / (1 + z/2), for z >= 0,
# fractional error below 1.2e-7 everywhere (a relative bound, unlike 1 + erf near -1)
_C = tuple(F(c) for c in (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806,
                          0.27886807, -1.13520398, 1.48851587, -0.82215223, 0.17087277))


@njit(cache=True, inline="always")
def erfc32_pos(z):
    """erfc of float32 ``z >= 0`` with a small relative error (the tail where 1 - erf(z)
    cancels): what an exact Gelu needs for large negative inputs."""
    t = _ONE / (_ONE + _HALF * z)
    p = _fma(t, _C[9], _C[8])
    p = _fma(t, p, _C[7])
    p = _fma(t, p, _C[6])
    p = _fma(t, p, _C[5])
    p = _fma(t, p, _C[4])
    p = _fma(t, p, _C[3])
    p = _fma(t, p, _C[2])
    p = _fma(t, p, _C[1])
    p = _fma(t, p, _C[0])
    return t * exp32(p - z * z)
