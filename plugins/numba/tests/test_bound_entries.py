"""Planned calls that run their kernel's machine code bound at the first call
(``onemodel.numba._jit.entry``), skipping numba's typing of each argument. That code reads its
arrays with the first call's dtypes, ranks and layouts unchecked, so every later call that
differs in any of them must take numba's dispatcher (or the generic call) instead: a strided
input after a contiguous one, an input of another dtype of the same item size, a strided
``out=``. Each case calls in such orders and compares with the generic call."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

from onemodel.numba import _jit, conv, fused, gemm, norm, pool, reduction, softmax
from onemodel.tensors import OneModelError, threads
from onemodel.tensors.ops.specialize import CallSite, specialize

RNG = np.random.default_rng(11)


def _x(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def _site(kernel, inputs, attrs, consts):
    generic = partial(kernel, **attrs)
    got = generic(*inputs)
    outs = got if isinstance(got, tuple) else (got,)
    # (a graph's LayerNormalization names only its first output, the statistics left out)
    out_shapes = tuple(o.shape if o is not None and k == 0 else None for k, o in enumerate(outs))
    return CallSite(tuple(a.shape for a in inputs), tuple(a.dtype for a in inputs),
                    tuple(a if i in consts else None for i, a in enumerate(inputs)),
                    dict(attrs), out_shapes, generic)


def _strided(a):
    big = np.full(a.shape[:-1] + (2 * a.shape[-1],), np.nan, a.dtype)
    big[..., ::2] = a
    return big[..., ::2]


def _first(result):
    return result[0] if isinstance(result, tuple) else result


@pytest.fixture
def binds(monkeypatch, no_depthwise_lanes):
    """The calls that bound a kernel's machine code (``_jit.bind``), counted (depthwise calls
    keep their path's kernel)."""
    made = []
    real = _jit.bind

    def counting(slot, kernel, args):
        made.append(kernel)
        return real(slot, kernel, args)
    monkeypatch.setattr(_jit, "bind", counting)
    saved = threads.num_threads()
    threads.set_num_threads(1)  # serial variants: the ones bound
    yield made
    threads.set_num_threads(saved)


CASES = [
    (fused.fused_elementwise, [_x(2, 6, 5, 7), _x(2, 6, 5, 7)], dict(program=("Add x0 x1",)),
     ()),
    (fused.fused_elementwise, [_x(2, 3, 40), _x(40)], dict(program=("Add x0 x1", "Relu t0")),
     (1,)),
    (fused.fused_elementwise, [_x(4, 9), _x(9), _x(4, 1)],
     dict(program=("Mul x0 x1", "Add t0 x2", "Sigmoid t1")), ()),
    (fused.fused_elementwise, [_x(2, 3, 4, 5), _x(1, 3, 1, 1), _x(2, 3, 4, 5)],
     dict(program=("Mul x0 x1", "Add t0 x2")), ()),  # three inputs, collapsed to (2, 3, 20)
    (fused.fused_elementwise, [_x(2, 5, 64), np.array(np.sqrt(2.0), np.float32),
                               np.array(1.0, np.float32), np.array(0.5, np.float32)],
     dict(program=("Div x0 x1", "Erf t0", "Add t1 x2", "Mul x0 t2", "Mul t3 x3")), (1, 2, 3)),
    (pool.max_pool, [_x(2, 3, 9, 9)], dict(kernel_shape=(3, 3), strides=(2, 2)), ()),
    (pool.average_pool, [_x(2, 3, 7, 6)], dict(kernel_shape=(3, 3), pads=(1, 1, 1, 1)), ()),
    (norm.batch_normalization, [_x(2, 3, 4, 4), _x(3), _x(3), _x(3), np.abs(_x(3)) + 0.5],
     {}, (1, 2, 3, 4)),
    (norm.layer_normalization, [_x(2, 5, 32), _x(32), _x(32)], {}, (1, 2)),
    (norm.rms_normalization, [_x(2, 5, 32), _x(32)], {}, (1,)),
    (norm.skip_layer_normalization, [_x(2, 5, 32), _x(2, 5, 32), _x(32), _x(32), _x(32)], {},
     (2, 3, 4)),
    (reduction.reduce_mean, [_x(2, 5, 3, 4), np.array([2, 3])], {}, (1,)),
    (softmax.softmax, [_x(3, 70)], {}, ()),
    (gemm.fused_gemm, [_x(3, 7), _x(7, 5), _x(5)], {}, (1, 2)),
    (conv.fused_conv, [_x(2, 8, 6, 6), _x(8, 1, 3, 3), _x(8)],
     dict(group=8, pads=(1, 1, 1, 1), strides=(2, 2)), (1, 2)),  # depthwise
    (conv.fused_conv, [_x(2, 5, 5, 5), _x(6, 5, 3, 3), _x(6)], dict(pads=(1, 1, 1, 1)),
     (1, 2)),  # small (five input channels: conv_rows.py takes four or fewer)
    (conv.fused_conv, [_x(2, 40, 8, 8), _x(24, 40, 1, 1), _x(24)], {}, (1, 2)),  # 1x1 direct
]
IDS = [f"{c[0].__name__}-{i}" for i, c in enumerate(CASES)]


@pytest.mark.parametrize("kernel,inputs,attrs,consts", CASES, ids=IDS)
def test_a_bound_call_equals_the_generic_one_in_any_order(kernel, inputs, attrs, consts, binds):
    """Contiguous, strided and contiguous again, and strided first: every call gives the
    generic call's values bit for bit; the machine code is bound once, at the first call
    whose arrays it suits."""
    site = _site(kernel, inputs, attrs, consts)
    call = specialize(kernel, site)
    assert call is not None
    want = _first(site.generic(*inputs))
    strided = [a if i in consts or not a.ndim else _strided(a) for i, a in enumerate(inputs)]
    for args in (strided, inputs, strided, inputs, strided):
        got = _first(call(*args))
        assert np.array_equal(got, want, equal_nan=True)
    assert len(binds) == 1  # bound at the first contiguous call, never again


@pytest.mark.parametrize("kernel,inputs,attrs,consts",
                         [c for c in CASES if c[0] is fused.fused_elementwise],
                         ids=[i for i, c in zip(IDS, CASES) if c[0] is fused.fused_elementwise])
def test_an_input_of_another_dtype_never_reaches_the_bound_code(kernel, inputs, attrs, consts,
                                                                 binds):
    """A chain's later input of another dtype of the same item size (int32 for float32), after
    the code was bound for float32: read as float32 bits it would be silently wrong."""
    site = _site(kernel, inputs, attrs, consts)
    call = specialize(kernel, site)
    call(*inputs)
    assert len(binds) == 1
    for j in range(1, len(inputs)):
        if j in consts:
            continue
        other = list(inputs)
        other[j] = np.round(inputs[j] * 10).astype(np.int32)
        assert np.array_equal(_first(call(*other)), _first(site.generic(*other)),
                              equal_nan=True)


@pytest.mark.parametrize("kernel,inputs,attrs,consts",
                         [c for c in CASES if c[0] in (fused.fused_elementwise, pool.max_pool,
                                                       norm.batch_normalization, softmax.softmax,
                                                       conv.fused_conv)],
                         ids=[i for i, c in zip(IDS, CASES)
                              if c[0] in (fused.fused_elementwise, pool.max_pool,
                                          norm.batch_normalization, softmax.softmax,
                                          conv.fused_conv)])
def test_a_strided_out_is_filled_or_refused(kernel, inputs, attrs, consts, binds):
    """After the bound call, a strided ``out=`` is filled with the generic call's values or
    refused with a OneModelError (the bound code writes only contiguous arrays)."""
    site = _site(kernel, inputs, attrs, consts)
    call = specialize(kernel, site)
    want = _first(site.generic(*inputs))
    out = np.full(want.shape, np.nan, want.dtype)
    assert call(*inputs, out=out) is out and np.array_equal(out, want, equal_nan=True)
    assert len(binds) == 1
    strided = _strided(np.zeros(want.shape, want.dtype))
    try:
        call(*inputs, out=strided)
    except OneModelError as exc:  # the out= contract refused, by name: never filled wrongly
        assert "C-contiguous" in str(exc)
    else:
        assert np.array_equal(strided, want, equal_nan=True)


def test_entry_is_the_dispatchers_code_for_those_types():
    """``_jit.entry`` compiles (or loads) the overload numba would pick for these arguments."""
    x = _x(2, 3, 4, 4)
    y = np.empty_like(x)
    kernel = norm._affine_planes.serial
    args = (x.reshape(2, 3, 16), _x(3), _x(3), y.reshape(2, 3, 16))
    run = _jit.entry(kernel, args)
    run(*args)
    want = np.empty_like(y)
    kernel(args[0], args[1], args[2], want.reshape(2, 3, 16))
    assert np.array_equal(y, want)


def _unaligned(a):
    """The same values in memory one byte off the item size's alignment."""
    buf = bytearray(a.nbytes + 1)
    buf[1:] = a.tobytes()
    out = np.frombuffer(buf, a.dtype, offset=1).reshape(a.shape)
    assert not out.flags.aligned and out.flags.c_contiguous
    return out


@pytest.mark.parametrize("kernel,inputs,attrs,consts", [CASES[0], CASES[2], CASES[-3]],
                         ids=[IDS[0], IDS[2], IDS[-3]])
def test_unaligned_inputs_after_aligned_ones(kernel, inputs, attrs, consts, binds):
    """Code bound for aligned arrays (numba types alignment too) reads unaligned ones right
    (on x86 its loads take any address)."""
    site = _site(kernel, inputs, attrs, consts)
    call = specialize(kernel, site)
    want = _first(site.generic(*inputs))
    assert np.array_equal(_first(call(*inputs)), want, equal_nan=True)
    odd = [a if i in consts or not a.ndim else _unaligned(a) for i, a in enumerate(inputs)]
    assert np.array_equal(_first(call(*odd)), want, equal_nan=True)
    assert len(binds) == 1


_WRITES_OUT = (fused.fused_elementwise, pool.max_pool, pool.average_pool,
               norm.batch_normalization, norm.rms_normalization, softmax.softmax, conv.fused_conv)
OUT_CASES = [c for c in CASES if c[0] in _WRITES_OUT]
OUT_IDS = [i for i, c in zip(IDS, CASES) if c[0] in _WRITES_OUT]


@pytest.mark.parametrize("kernel,inputs,attrs,consts", OUT_CASES, ids=OUT_IDS)
def test_a_read_only_or_other_dtype_out_never_takes_the_bound_code(kernel, inputs, attrs,
                                                                    consts, binds):
    """After the code is bound, a read-only ``out=`` is refused and left as it was (the bound
    code would write into it), and an ``out=`` of another dtype of the same item size gets
    what the generic call gives it, or is refused as the generic call refuses it (the bound
    code would write float32 bits into it)."""
    site = _site(kernel, inputs, attrs, consts)
    call = specialize(kernel, site)
    want = _first(site.generic(*inputs))
    call(*inputs)
    assert len(binds) == 1
    raw = bytes(want.nbytes)
    read_only = np.frombuffer(raw, want.dtype).reshape(want.shape)
    with pytest.raises(_refusal(site.generic, inputs, np.frombuffer(bytes(want.nbytes),
                                                                    want.dtype).reshape(want.shape))):
        call(*inputs, out=read_only)
    assert raw == bytes(want.nbytes)
    for dtype in (np.int32, np.dtype(">f4")):
        got, expected = np.zeros(want.shape, dtype), np.zeros(want.shape, dtype)
        refused = _refusal(site.generic, inputs, expected)
        if refused is not None:
            with pytest.raises(refused):
                call(*inputs, out=got)
            continue
        call(*inputs, out=got)
        assert np.array_equal(got, expected, equal_nan=True)


def _refusal(generic, inputs, out):
    """The type of error the generic call raises for this ``out=``, or None when it fills it."""
    try:
        generic(*inputs, out=out)
    except Exception as exc:  # whichever it is, the planned call must refuse alike
        return type(exc)
    return None


@pytest.mark.parametrize("kernel,inputs,attrs,consts", [CASES[0], CASES[2], CASES[-1]],
                         ids=[IDS[0], IDS[2], IDS[-1]])
def test_an_out_made_read_only_after_use_is_not_written(kernel, inputs, attrs, consts, binds):
    """The calls that keep views of the out= they were last given (a plan hands the same
    buffer each run) notice when that array has been made read-only since."""
    site = _site(kernel, inputs, attrs, consts)
    call = specialize(kernel, site)
    want = _first(site.generic(*inputs))
    out = np.zeros(want.shape, want.dtype)
    assert call(*inputs, out=out) is out and np.array_equal(out, want)
    out[...] = 0
    out.flags.writeable = False
    with pytest.raises(_refusal(site.generic, inputs, out)):
        call(*inputs, out=out)
    assert not out.any()


# planned calls handed the same array objects call after call, as a plan hands its buffers run
# after run: whatever a call keeps from one call to the next (bound code, views of its out=),
# the values and flags of those arrays may have changed in between
def _frozen(a):
    """``a``'s values read-only over immutable bytes, as a constant loaded from a file is: the
    planned calls prepare such weights once and do not check them per call."""
    return np.frombuffer(a.tobytes(), a.dtype).reshape(a.shape)


def _with_frozen_constants(case):
    kernel, inputs, attrs, consts = case
    return kernel, [_frozen(a) if i in consts else a for i, a in enumerate(inputs)], attrs, consts


SAME_ARRAYS = [CASES[5], CASES[6], _with_frozen_constants(CASES[-3]),
               _with_frozen_constants(CASES[-2]),
               (pool.global_average_pool, [_x(2, 6, 1, 1)], {}, ())]
SAME_IDS = ["max_pool", "average_pool", "depthwise", "small_conv", "global_average_1x1"]


def _planned(kernel, inputs, attrs, consts):
    site = _site(kernel, inputs, attrs, consts)
    call = specialize(kernel, site)
    assert call is not None
    return site, call


@pytest.mark.parametrize("kernel,inputs,attrs,consts", SAME_ARRAYS, ids=SAME_IDS)
def test_a_call_on_the_same_arrays_reads_their_values_now(kernel, inputs, attrs, consts, binds):
    """The same input and out objects again, their values changed in place in between: each
    call gives the generic call's values for what the input holds now."""
    site, call = _planned(kernel, inputs, attrs, consts)
    x = inputs[0].copy()
    rest = list(inputs[1:])
    out = np.zeros_like(_first(site.generic(x, *rest)))
    for k in range(3):
        x[...] = _x(*x.shape) * (k + 1)
        assert call(x, *rest, out=out) is out
        assert np.array_equal(out, _first(site.generic(x, *rest)), equal_nan=True)


@pytest.mark.parametrize("kernel,inputs,attrs,consts", SAME_ARRAYS, ids=SAME_IDS)
def test_a_strided_input_is_copied_again_each_call(kernel, inputs, attrs, consts, binds):
    """A strided input is copied for the kernel: the same strided array again, its values
    changed, must be copied again (a call that kept the first call's arguments would read
    the stale copy)."""
    site, call = _planned(kernel, inputs, attrs, consts)
    x = _strided(inputs[0])
    rest = list(inputs[1:])
    out = np.zeros_like(_first(site.generic(x, *rest)))
    for k in range(3):
        x[...] = _x(*x.shape) * (k + 1)
        call(x, *rest, out=out)
        assert np.array_equal(out, _first(site.generic(x, *rest)), equal_nan=True)


@pytest.mark.parametrize("kernel,inputs,attrs,consts", SAME_ARRAYS, ids=SAME_IDS)
def test_an_input_restrided_in_place_is_read_with_its_new_strides(kernel, inputs, attrs, consts, binds):
    """The same array object given new strides in place (deprecated in NumPy, still possible):
    a call that trusted the object it saw before would read it as contiguous."""
    site, call = _planned(kernel, inputs, attrs, consts)
    base = np.zeros(2 * inputs[0].size, inputs[0].dtype)
    x = base[:inputs[0].size].reshape(inputs[0].shape)
    x[...] = inputs[0]
    rest = list(inputs[1:])
    out = np.zeros_like(_first(site.generic(x, *rest)))
    call(x, *rest, out=out)
    base[:] = _x(base.size)
    with pytest.warns(DeprecationWarning):
        x.strides = tuple(2 * s for s in x.strides)  # every other element of base now
    assert not x.flags.c_contiguous
    call(x, *rest, out=out)
    assert np.array_equal(out, _first(site.generic(x, *rest)), equal_nan=True)


@pytest.mark.parametrize("kernel,inputs,attrs,consts", SAME_ARRAYS, ids=SAME_IDS)
def test_an_out_made_read_only_between_calls_is_refused(kernel, inputs, attrs, consts, binds):
    """An out= that was filled, then made read-only: the next call with the same arrays is
    refused as the generic call refuses it, and the out is left as it was."""
    site, call = _planned(kernel, inputs, attrs, consts)
    want = _first(site.generic(*inputs))
    out = np.zeros(want.shape, want.dtype)
    call(*inputs, out=out)
    call(*inputs, out=out)
    out[...] = 0
    out.flags.writeable = False
    with pytest.raises(_refusal(site.generic, inputs, out)):
        call(*inputs, out=out)
    assert not out.any()


def test_a_small_convolution_with_a_strided_bias_reads_it_each_call(binds):
    """A bias that is not the plan's constant is copied when strided: the same bias object
    with new values must give the new sum, not the first call's copy (a narrow convolution
    with read-only weights: the kernel along the output channels, which takes any bias)."""
    x, w = _x(2, 16, 2, 2), _frozen(_x(40, 16, 1, 1))
    bias = _strided(_x(40))
    kernel = conv.fused_conv
    site, call = _planned(kernel, [x, w, bias], {}, (1,))
    assert call.__name__ == "conv_small_at"
    out = np.zeros_like(site.generic(x, w, bias))
    for k in range(3):
        bias[...] = _x(40) * (k + 1)
        call(x, w, bias, out=out)
        assert np.allclose(out, site.generic(x, w, bias), rtol=1e-5, atol=1e-5)


def test_a_depthwise_call_with_writable_weights_checks_them_every_call(binds):
    """Writable weights on a depthwise path that skips the padding are checked each call: one
    made infinite in place since must reach the kernel that reads the padding (inf times the
    padding's zero is NaN there, as in the generic call), also when the same arrays come again."""
    kernel, inputs, attrs, consts = CASES[-3]
    x, w, b = inputs[0], inputs[1].copy(), inputs[2]
    site, call = _planned(kernel, [x, w, b], attrs, consts)
    plan = conv._plan(x.shape, w.shape, 4, None, attrs["strides"], attrs["pads"], None,
                      "NOTSET", attrs["group"], True)
    assert plan[0] in conv._SKIPS_PADDING
    out = np.zeros_like(site.generic(x, w, b))
    call(x, w, b, out=out)
    call(x, w, b, out=out)
    w[0, 0, 0, 0] = np.inf
    call(x, w, b, out=out)
    want = site.generic(x, w, b)
    assert np.isnan(want).any()
    assert np.array_equal(out, want, equal_nan=True)


@pytest.mark.parametrize("kernel,inputs,attrs,consts", SAME_ARRAYS, ids=SAME_IDS)
def test_a_planned_call_does_not_keep_a_callers_input_alive(kernel, inputs, attrs, consts,
                                                             binds):
    """Nothing a planned call keeps holds its input: a caller's array is freed when the
    caller drops it, however large."""
    import gc
    import weakref

    site, call = _planned(kernel, inputs, attrs, consts)
    x = inputs[0].copy()
    out = np.zeros_like(_first(site.generic(x, *inputs[1:])))
    call(x, *inputs[1:], out=out)
    gone = weakref.ref(x)
    del x
    gc.collect()
    assert gone() is None


@pytest.mark.parametrize("kernel,inputs,attrs,consts", SAME_ARRAYS, ids=SAME_IDS)
def test_threads_calling_into_their_own_outs_each_get_their_own(kernel, inputs, attrs, consts,
                                                                 binds):
    """Two threads calling one planned call at once, each with its own input and out (two
    runs of a plan hold two buffer sets): each out gets the generic call's values for its own
    input, however their calls interleave."""
    import threading

    site, call = _planned(kernel, inputs, attrs, consts)
    xs = [inputs[0].copy(), inputs[0] * 3 - 1]
    wants = [_first(site.generic(x, *inputs[1:])) for x in xs]
    failures = []

    def work(k):
        out = np.zeros_like(wants[k])
        for _ in range(300):
            out[...] = 0
            call(xs[k], *inputs[1:], out=out)
            if not np.array_equal(out, wants[k], equal_nan=True):
                failures.append(k)
                return

    workers = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert not failures
