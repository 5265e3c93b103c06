"""FusedAttention (float32/float64): softmax(Q @ Kt * scale + mask) @ V.

float32 heads of up to 32 K multiply-adds with rows of Q and V of at most 32 take register
tiles of eight lanes (:func:`_attention_lanes`): the products four rows by eight lanes, one
flat exp over the head's scores. Other heads of up to 1,024 multiply-adds (float64, hosts
without FMA, longer rows) take one kernel that works a query row at a time: its
scores, their softmax and the weighted sum of V's rows, with the row in a scratch buffer,
reading Q, Kt, V and the mask through their strides (the transposed views exported graphs
hand over are never copied) and broadcasting the mask by index. Larger heads keep their
products in BLAS: Q @ Kt into one scores array, the scale and the mask added in place, the
softmax of its rows (softmax.py's kernels) into a second array, then the product with V
into the output."""

from __future__ import annotations

import math

import numpy as np

from numba import prange
from onemodel.tensors.ops.specialize import CallSite, specializer

from ._jit import jit, pick, sync_threads
from ._simd import add8, first8, fma8, hmax8, host_has_fma, load8, max8, mul8, splat8, store8
from ._vecmath import _BIAS, _EXP_LOW, _FIELD, _float32_from_bits, exp_reduced
from .softmax import rows_kernel
from .support import attention as supports

U = np.uint64
# multiply-adds per head (Sq * Sk * (D + Dv)) up to which the one-pass kernel runs; above it
# the scores go through BLAS (measured: see docs/benchmarks.md, "Sixth round")
ROWS_MAX_WORK = 1024
# the lanes kernel's reach: heads of at most this much work and Q's and V's rows at most
# this long (its per-head copies of Kt and V cost more than BLAS's products past them)
LANES_MAX_WORK = 32 << 10
LANES_MAX_DEPTH = 32
_LOWEST = _EXP_LOW  # log of the smallest normal float32: exp below it is taken as 0


@jit(parallel=True)
def _attention_rows(q, kt, v, mask, has_mask, scale, scratch, out, heads_last):
    """out[b, h, i] = softmax(q[b, h, i] @ kt[b, h] * scale + mask[...]) @ v[b, h] (``out[b, i,
    h]`` with ``heads_last``: the (B, S, H, Dv) layout the heads are gathered in), one query
    row at a time. Each head's Q, Kt and V are first copied from their strides into the head's
    part of ``scratch`` (flat, C-contiguous), so the products' inner loops run over unit
    strides and vectorize. The mask is 4-D; an axis of size 1 broadcasts. A row holding NaN, or
    whose largest score is infinite, gives NaN, as the unfused Softmax does."""
    nb, nh, sq, d = q.shape
    sk = kt.shape[3]
    dv = v.shape[3]
    mb = mask.shape[0] > 1
    mh = mask.shape[1] > 1
    mi = mask.shape[2] > 1
    mj = mask.shape[3] > 1
    zero = np.zeros(1, out.dtype)[0]
    per = sq * d + d * sk + sk * dv + sk + dv
    for t in prange(nb * nh):
        b = t // nh
        h = t - b * nh
        bm = b if mb else 0
        hm = h if mh else 0
        qo = t * per  # the head's Q (sq, d), Kt (d, sk), V (sk, dv), scores (sk), sums (dv)
        ko = qo + sq * d
        vo = ko + d * sk
        so = vo + sk * dv
        ao = so + sk
        for i in range(sq):
            for e in range(d):
                scratch[U(qo + i * d + e)] = q[b, h, i, e]
        for e in range(d):
            for j in range(sk):
                scratch[U(ko + e * sk + j)] = kt[b, h, e, j]
        for j in range(sk):
            for e in range(dv):
                scratch[U(vo + j * dv + e)] = v[b, h, j, e]
        for i in range(sq):
            im = i if mi else 0
            for j in range(sk):
                scratch[U(so + j)] = zero
            for e in range(d):
                qe = scratch[U(qo + i * d + e)]
                krow = ko + e * sk
                for j in range(sk):
                    scratch[U(so + j)] += qe * scratch[U(krow + j)]
            if has_mask:
                for j in range(sk):
                    scratch[U(so + j)] = scratch[U(so + j)] * scale + \
                        mask[bm, hm, im, j if mj else 0]
            else:
                for j in range(sk):
                    scratch[U(so + j)] = scratch[U(so + j)] * scale
            m = scratch[U(so)]
            for j in range(1, sk):
                w = scratch[U(so + j)]
                m = w if w > m else m
            total = 0.0
            for j in range(sk):
                w = math.exp(scratch[U(so + j)] - m)
                scratch[U(so + j)] = w
                total += w
            inv = 1.0 / total
            for j in range(sk):
                scratch[U(so + j)] = scratch[U(so + j)] * inv  # stored in the dtype
            for e in range(dv):
                scratch[U(ao + e)] = zero
            for j in range(sk):
                p = scratch[U(so + j)]
                vrow = vo + j * dv
                for e in range(dv):
                    scratch[U(ao + e)] += p * scratch[U(vrow + e)]
            row = out[b, i, h] if heads_last else out[b, h, i]
            for e in range(dv):
                row[e] = scratch[U(ao + e)]


@jit(parallel=True)
def _attention_lanes(q, kt, v, mask, has_mask, scale, scratch, out, heads_last):
    """float32 ``out[b, h] = softmax(q[b, h] @ kt[b, h] * scale + mask) @ v[b, h]`` (into
    ``out[b, :, h]`` with ``heads_last``) on register
    tiles of eight lanes (:mod:`._simd`, AVX2/FMA). Per head: Kt and V are copied into panels
    whose rows are padded to eight with zeros; the scores are four query rows by eight keys
    per tile (a broadcast of Q, a load of the panel, four fused multiply-adds per step of D);
    each row is scaled and its maximum subtracted a vector at a time (the lanes past its end
    set to -inf; a scalar loop per row with its running maximum took 0.9 of a 2x2x17x16
    call's 2.3 us a head), then one flat exp runs over the head's rows (loops of 5 or 17 keys
    would run in their scalar remainder), then each row's float64 sum scales it;
    the output is four rows by eight of V's columns per tile. A row holding NaN, or whose
    largest score is infinite, gives NaN, as the unfused Softmax does."""
    nb, nh, sq, d = q.shape
    sk = kt.shape[3]
    dv = v.shape[3]
    skp = (sk + 7) // 8 * 8
    dvp = (dv + 7) // 8 * 8
    mb = mask.shape[0] > 1
    mh = mask.shape[1] > 1
    mi = mask.shape[2] > 1
    mj = mask.shape[3] > 1
    per = d * skp + sk * dvp + 2 * sq * skp + 4 * dvp + sq
    zero = np.float32(0.0)
    zero8 = splat8(zero)
    minus_inf = np.float32(-np.inf)
    lowest8 = splat8(minus_inf)
    scale8 = splat8(scale)
    last = skp - 8  # the offset of each row's last vector
    for t in prange(nb * nh):
        b = t // nh
        h = t - b * nh
        bm = b if mb else 0
        hm = h if mh else 0
        # Kt (d, skp), V (sk, dvp), the scores and their 2**n (sq, skp), a tile (4, dvp), and
        # a flag per row (1 where the row is NaN)
        ko = t * per
        vo = ko + d * skp
        so = vo + sk * dvp
        po = so + sq * skp
        to = po + sq * skp
        fo = to + 4 * dvp
        for e in range(d):
            for j in range(sk):
                scratch[U(ko + e * skp + j)] = kt[b, h, e, j]
            for j in range(sk, skp):
                scratch[U(ko + e * skp + j)] = zero
        for j in range(sk):
            for e in range(dv):
                scratch[U(vo + j * dvp + e)] = v[b, h, j, e]
            for e in range(dv, dvp):
                scratch[U(vo + j * dvp + e)] = zero
        for jc in range(0, skp, 8):
            for i in range(0, sq, 4):  # past the last row, the last row again (stored alike)
                i1, i2, i3 = min(i + 1, sq - 1), min(i + 2, sq - 1), min(i + 3, sq - 1)
                a0, a1, a2, a3 = zero8, zero8, zero8, zero8
                for e in range(d):
                    kv = load8(scratch, U(ko + e * skp + jc))
                    a0 = fma8(splat8(q[b, h, i, e]), kv, a0)
                    a1 = fma8(splat8(q[b, h, i1, e]), kv, a1)
                    a2 = fma8(splat8(q[b, h, i2, e]), kv, a2)
                    a3 = fma8(splat8(q[b, h, i3, e]), kv, a3)
                store8(scratch, U(so + i * skp + jc), a0)
                store8(scratch, U(so + i1 * skp + jc), a1)
                store8(scratch, U(so + i2 * skp + jc), a2)
                store8(scratch, U(so + i3 * skp + jc), a3)
        for i in range(sq):  # each row scaled (masked), its maximum subtracted
            row = so + i * skp
            if has_mask:  # added by index (the mask broadcasts), two roundings as unfused
                im = i if mi else 0
                for j in range(sk):
                    scratch[U(row + j)] = scratch[U(row + j)] * scale + \
                        mask[bm, hm, im, j if mj else 0]
            top = lowest8
            for jc in range(0, last, 8):
                w = load8(scratch, U(row + jc))
                if not has_mask:
                    w = mul8(w, scale8)
                    store8(scratch, U(row + jc), w)
                top = max8(top, w)
            w = load8(scratch, U(row + last))
            if not has_mask:
                w = mul8(w, scale8)
            # the padding's lanes (scores of zero columns, NaN where Q holds infinity) take no
            # part in the maximum; -inf, their exps are 0
            w = first8(w, sk - last, minus_inf)
            store8(scratch, U(row + last), w)
            m = hmax8(max8(top, w))  # NaN if the row holds one
            bad = not (abs(m) < np.inf)
            scratch[U(fo + i)] = 1.0 if bad else zero
            # a bad row's exps are taken of zeros (NaN has no int exponent)
            shift = splat8(zero if bad else -m)  # w + -m is w - m, exactly
            for jc in range(0, skp, 8):
                store8(scratch, U(row + jc),
                       zero8 if bad else add8(load8(scratch, U(row + jc)), shift))
        n = sq * skp
        for k in range(n):
            x = scratch[U(so + k)]
            low = x < _LOWEST
            x = _LOWEST if low else x
            e, p = exp_reduced(x)
            scratch[U(so + k)] = zero if low else p
            scratch[U(po + k)] = _float32_from_bits(np.int32((e + _BIAS) * _FIELD))
        for k in range(n):
            scratch[U(so + k)] *= scratch[U(po + k)]
        for i in range(sq):
            row = so + i * skp
            total = 0.0  # float64, as the row kernel's sum
            for j in range(sk):
                total += scratch[U(row + j)]
            inv = np.float32(np.nan if scratch[U(fo + i)] != zero else 1.0 / total)
            for j in range(sk):
                scratch[U(row + j)] *= inv
        for i in range(0, sq, 4):
            i1, i2, i3 = min(i + 1, sq - 1), min(i + 2, sq - 1), min(i + 3, sq - 1)
            for dc in range(0, dvp, 8):
                a0, a1, a2, a3 = zero8, zero8, zero8, zero8
                for j in range(sk):
                    vv = load8(scratch, U(vo + j * dvp + dc))
                    a0 = fma8(splat8(scratch[U(so + i * skp + j)]), vv, a0)
                    a1 = fma8(splat8(scratch[U(so + i1 * skp + j)]), vv, a1)
                    a2 = fma8(splat8(scratch[U(so + i2 * skp + j)]), vv, a2)
                    a3 = fma8(splat8(scratch[U(so + i3 * skp + j)]), vv, a3)
                store8(scratch, U(to + dc), a0)
                store8(scratch, U(to + dvp + dc), a1)
                store8(scratch, U(to + 2 * dvp + dc), a2)
                store8(scratch, U(to + 3 * dvp + dc), a3)
            for r in range(min(4, sq - i)):
                row = out[b, i + r, h] if heads_last else out[b, h, i + r]
                for e in range(dv):
                    row[e] = scratch[U(to + r * dvp + e)]


@jit(parallel=True)
def _scale_mask(x, mask, has_mask, scale):
    """x[b, h, i] = x[b, h, i] * scale + mask[...] in place (an axis of the 4-D mask of size 1
    broadcasts)."""
    nb, nh, sq, sk = x.shape
    mj = 1 if mask.shape[3] > 1 else 0
    for t in prange(nb * nh):
        b = t // nh
        h = t - b * nh
        bm = b if mask.shape[0] > 1 else 0
        hm = h if mask.shape[1] > 1 else 0
        for i in range(sq):
            row = x[b, h, i]
            if has_mask:
                im = i if mask.shape[2] > 1 else 0
                for j in range(sk):
                    row[j] = row[j] * scale + mask[bm, hm, im, j * mj]
            else:
                for j in range(sk):
                    row[j] = row[j] * scale


def _four_d(shape) -> tuple[int, ...]:
    return (1,) * (4 - len(shape)) + tuple(shape)


def _run(q4, kt4, v4, m4, has_mask, scale, out4, path: str, heads_last=False):
    """The attention of 4-D views by ``path`` (:func:`_path`) into ``out4``, C-contiguous:
    (B, H, Sq, Dv), or with ``heads_last`` (B, Sq, H, Dv) (the op's ``transpose_output``), each
    output row written where it goes."""
    if out4.size == 0:
        return
    if kt4.shape[3] == 0:  # no keys: softmax over nothing, an empty sum of V's rows
        out4[...] = 0
        return
    if path == "lanes":
        nb, nh, sq, d = q4.shape
        sk, dv = kt4.shape[3], v4.shape[3]
        skp, dvp = -(-sk // 8) * 8, -(-dv // 8) * 8
        scratch = np.empty(nb * nh * (d * skp + sk * dvp + 2 * sq * skp + 4 * dvp + sq),
                           np.float32)
        pick(_attention_lanes)(q4, kt4, v4, m4, has_mask, scale, scratch, out4, heads_last)
        return
    if path == "rows":
        nb, nh, sq, d = q4.shape
        sk, dv = kt4.shape[3], v4.shape[3]
        scratch = np.empty(nb * nh * (sq * d + d * sk + sk * dv + sk + dv), out4.dtype)
        pick(_attention_rows)(q4, kt4, v4, m4, has_mask, scale, scratch, out4, heads_last)
        return
    scores = np.matmul(q4, kt4)
    if has_mask or scale != 1:
        pick(_scale_mask)(scores, m4, has_mask, scale)
    sk = scores.shape[3]
    probs = np.empty(scores.shape, scores.dtype)
    # into a second array: with the rows aliased, the exp loop's run-time overlap check
    # sends it to its scalar version (8.0 against 4.3 us on 68 rows of 17)
    pick(rows_kernel(scores.dtype, sk, False))(scores.reshape(-1, sk), probs.reshape(-1, sk),
                                                False)
    np.matmul(probs, v4, out=out4.transpose(0, 2, 1, 3) if heads_last else out4)


def _path(q_shape, kt_shape, v_shape, dtype) -> str:
    """"lanes" (:func:`_attention_lanes`), "rows" (:func:`_attention_rows`) or "blas":
    where each measured fastest (docs/benchmarks.md, "Twenty-second round")."""
    work = q_shape[-2] * kt_shape[-1] * (q_shape[-1] + v_shape[-1])
    if dtype == np.float32 and q_shape[-1] <= LANES_MAX_DEPTH and \
            v_shape[-1] <= LANES_MAX_DEPTH and work <= LANES_MAX_WORK and host_has_fma():
        return "lanes"
    return "rows" if work <= ROWS_MAX_WORK else "blas"


_NO_MASK = {np.dtype(t): np.zeros((1, 1, 1, 1), t) for t in (np.float32, np.float64)}


def _covered(Q, Kt, V, mask) -> bool:
    """Whether the kernels compute these inputs: the plugin's supports check, the inner sizes
    matching and the mask broadcasting to the scores. The kernels index without bounds checks,
    so anything else goes to the reference kernel (which names a mismatch)."""
    if not supports(Q, Kt, V, mask) or Q.shape[-1] != Kt.shape[-2] or \
            Kt.shape[-1] != V.shape[-2]:
        return False
    scores = Q.shape[:-1] + Kt.shape[-1:]
    return mask is None or all(m in (1, n) for m, n in zip(mask.shape[::-1], scores[::-1]))


def fused_attention(Q, Kt, V, mask=None, *, scale=1.0, transpose_output=0, out=None):
    """softmax(Q @ Kt * scale + mask, last axis) @ V for float32/float64 Q, Kt, V of rank 2-4
    with the same leading (batch, head) axes and a mask that broadcasts to the scores; with
    ``transpose_output`` (rank 4), written as (B, S, H, Dv)."""
    y_shape = Q.shape[:-1] + V.shape[-1:]
    if transpose_output and Q.ndim == 4:
        y_shape = (y_shape[0], y_shape[2], y_shape[1], y_shape[3])
    # the kernels index without bounds checks: an out= of another shape, dtype or layout (or
    # a transpose_output they cannot write) goes to the reference, which names the problem
    if not _covered(Q, Kt, V, mask) or (transpose_output and Q.ndim != 4) or (
            out is not None and (out.shape != y_shape or out.dtype != Q.dtype
                                 or not out.flags.carray)):
        from onemodel.tensors.ops import OPS

        return OPS["FusedAttention"].kernel(Q, Kt, V, mask, scale=scale,
                                            transpose_output=transpose_output, out=out)
    sync_threads()
    dtype = Q.dtype
    y = np.empty(y_shape, dtype) if out is None else out
    out4 = y if transpose_output else y.reshape(_four_d(y_shape), copy=False)
    m4 = _NO_MASK[dtype] if mask is None else mask.reshape(_four_d(mask.shape))
    _run(Q.reshape(_four_d(Q.shape)), Kt.reshape(_four_d(Kt.shape)),
         V.reshape(_four_d(V.shape)), m4, mask is not None, dtype.type(scale), out4,
         _path(Q.shape, Kt.shape, V.shape, dtype), bool(transpose_output))
    return y


@specializer(fused_attention)
def _fused_attention_at(site: CallSite):
    """FusedAttention planned for its shapes: the 4-D shapes, the path and the scale worked
    out once; a call checks its inputs and runs one path."""
    shapes, dtypes = site.shapes, site.dtypes
    if any(s is None for s in shapes[:3]) or dtypes[0] not in _NO_MASK:
        return None
    q_shape, kt_shape, v_shape = shapes[0], shapes[1], shapes[2]
    m_shape = shapes[3] if len(shapes) > 3 else None
    has_mask = m_shape is not None
    if has_mask and len(m_shape) > 4:
        return None
    dtype = np.dtype(dtypes[0])
    y_shape = q_shape[:-1] + v_shape[-1:]
    transposed = bool(site.attrs.get("transpose_output", 0))
    if transposed and len(q_shape) != 4:
        return None
    q4, kt4, v4, y4 = (_four_d(s) for s in (q_shape, kt_shape, v_shape, y_shape))
    m4 = _four_d(m_shape) if has_mask else None
    scale = dtype.type(site.attrs.get("scale", 1.0))
    path = _path(q_shape, kt_shape, v_shape, dtype)
    four_d = len(q_shape) == 4
    out_shape = (y_shape[0], y_shape[2], y_shape[1], y_shape[3]) if transposed else y_shape
    no_mask = _NO_MASK[dtype]
    generic = site.generic

    def attention_at(Q, Kt, V, mask=None, out=None):
        if Q.shape != q_shape or Kt.shape != kt_shape or V.shape != v_shape or \
                Q.dtype != dtype or Kt.dtype != dtype or V.dtype != dtype or \
                (mask is None) == has_mask or (has_mask and (mask.shape != m_shape
                                                            or mask.dtype != dtype)):
            return generic(Q, Kt, V, mask, out=out)
        sync_threads()
        if transposed:  # (B, S, H, Dv): each output row written where it goes
            if out is not None and (out.shape != out_shape or out.dtype != dtype or
                                    not out.flags.carray):
                return generic(Q, Kt, V, mask, out=out)
            y = np.empty(out_shape, dtype) if out is None else out
            _run(Q, Kt, V, mask.reshape(m4) if has_mask else no_mask, has_mask, scale, y, path,
                 True)
            return y
        y = np.empty(y_shape, dtype) if out is None else out
        if four_d:  # the usual case: no views to make
            _run(Q, Kt, V, mask.reshape(m4) if has_mask else no_mask, has_mask, scale, y, path)
        else:
            _run(Q.reshape(q4), Kt.reshape(kt4), V.reshape(v4),
                 mask.reshape(m4) if has_mask else no_mask, has_mask, scale,
                 y.reshape(y4, copy=False), path)  # never write into a copy of out
        return y
    return attention_at
