"""LSTM and GRU forward passes (inference): the input projection of every step at once in BLAS,
then one numba loop over time that does each step's recurrent product and gates without
returning to Python. The reference runs a step as a dozen numpy calls on (batch, hidden)
arrays: a one-layer LSTM of 50 steps (batch 2, 32 inputs, 64 hidden) took 1012 us against
onnxruntime's 77.

Covered: the default activations (LSTM Sigmoid, Tanh, Tanh; GRU Sigmoid, Tanh), no clip, every
sequence at full length (``sequence_lens`` omitted), any direction and layout, peepholes,
``input_forget``, and GRU's ``linear_before_reset`` either way. Anything else goes to the
reference kernel (see :func:`onemodel.numba.support.lstm`). float32 gates use the plugin's
vectorized sigmoid and tanh (a few ulp); float64 ones numpy's formulas through libm."""

from __future__ import annotations

import numpy as np

from numba import types
from numba.extending import overload

from ._jit import jit
from ._vecmath import sigmoid32, tanh32

U = np.uint64


def _sigmoid(v):
    """The sigmoid in v's dtype (compiled per dtype, below)."""


def _tanh(v):
    """tanh in v's dtype (compiled per dtype, below)."""


@overload(_sigmoid)
def _sigmoid_typed(v):
    """float32: the vectorized form; float64: the reference's 0.5 * (1 + tanh(v / 2))."""
    if v == types.float32:
        return lambda v: sigmoid32(v)
    return lambda v: 0.5 * (1.0 + np.tanh(v * 0.5))


@overload(_tanh)
def _tanh_typed(v):
    if v == types.float32:
        return lambda v: tanh32(v)
    return lambda v: np.tanh(v)


@jit(fastmath={"contract"})
def _add_products(acc, vecs, rt, col, width):
    """acc[n, col + j] += sum_k vecs[n, k] * rt[k, col + j] for j < width, every batch row n:
    the step's recurrent product. Eight rows of ``rt`` (R transposed, (H, G), C-contiguous) a
    pass, so each pass loads and stores a row of ``acc`` once for eight multiply-adds (four
    measured 1.3x the time), and the batch rows inside the pass, so those rows of ``rt`` are
    read from memory once a step."""
    n_rows, hid = vecs.shape
    g = rt.shape[1]
    rf = rt.reshape(rt.size)
    af = acc.reshape(acc.size)
    vf = vecs.reshape(vecs.size)
    octs = hid // 8
    for q8 in range(octs):
        k = 8 * q8
        b0 = k * g + col
        for n in range(n_rows):
            vb = n * hid + k
            v0, v1, v2, v3 = vf[U(vb)], vf[U(vb + 1)], vf[U(vb + 2)], vf[U(vb + 3)]
            v4, v5, v6, v7 = vf[U(vb + 4)], vf[U(vb + 5)], vf[U(vb + 6)], vf[U(vb + 7)]
            a0 = n * g + col
            for j in range(width):
                b = b0 + j
                af[U(a0 + j)] += ((v0 * rf[U(b)] + v1 * rf[U(b + g)]) + (
                    v2 * rf[U(b + 2 * g)] + v3 * rf[U(b + 3 * g)])) + ((
                        v4 * rf[U(b + 4 * g)] + v5 * rf[U(b + 5 * g)]) + (
                        v6 * rf[U(b + 6 * g)] + v7 * rf[U(b + 7 * g)]))
    for k in range(8 * octs, hid):
        b0 = k * g + col
        for n in range(n_rows):
            v = vf[U(n * hid + k)]
            a0 = n * g + col
            for j in range(width):
                af[U(a0 + j)] += v * rf[U(b0 + j)]


@jit()
def _lstm_gates(a, p, has_p, input_forget, h, c, y, t, k):
    """Step ``t`` of an LSTM from its pre-activations ``a`` (N, 4H). ``p`` (3H,): peepholes i,
    o, f; ``h``, ``c`` (N, H): the state, updated in place; ``y`` (T, D, N, H): slot ``k`` of
    step ``t`` written. Gates in ONNX's order i, o, f, c."""
    n_rows, g = a.shape
    hid = g // 4
    dirs = y.shape[1]
    one = np.zeros(1, a.dtype)[0] + np.float32(1)
    # flat views and unsigned offsets: loops without negative-index checks, which vectorize
    af, cf, hf, yf = a.reshape(a.size), c.reshape(c.size), h.reshape(h.size), y.reshape(y.size)
    for n in range(n_rows):
        ab, hb = n * g, n * hid
        yb = ((t * dirs + k) * n_rows + n) * hid
        for j in range(hid):
            cp = cf[U(hb + j)]
            ai = af[U(ab + j)]
            fa = af[U(ab + 2 * hid + j)]
            if has_p:
                ai += p[U(j)] * cp
                fa += p[U(2 * hid + j)] * cp
            i = _sigmoid(ai)
            f = one - i if input_forget else _sigmoid(fa)
            cn = f * cp + i * _tanh(af[U(ab + 3 * hid + j)])
            ao = af[U(ab + hid + j)]
            if has_p:
                ao += p[U(hid + j)] * cn
            hv = _sigmoid(ao) * _tanh(cn)
            cf[U(hb + j)] = cn
            hf[U(hb + j)] = hv
            yf[U(yb + j)] = hv


@jit()
def _lstm_steps(xw, bias, rt, p, has_p, input_forget, h, c, y, k, reverse):
    """One direction of an LSTM over time, its recurrent products here (see :func:`_lstm_gates`
    for the arguments; ``rt`` (H, 4H): R transposed; ``reverse``: the steps run from the last
    to the first, written in the input's time order)."""
    steps, n_rows, g = xw.shape
    a = np.empty((n_rows, g), xw.dtype)
    af, xf = a.reshape(a.size), xw.reshape(xw.size)
    for s in range(steps):
        t = steps - 1 - s if reverse else s
        for n in range(n_rows):
            xb, ab = (t * n_rows + n) * g, n * g
            for j in range(g):
                af[U(ab + j)] = xf[U(xb + j)] + bias[U(j)]
        _add_products(a, h, rt, 0, g)
        _lstm_gates(a, p, has_p, input_forget, h, c, y, t, k)


@jit()
def _gru_gates(a, xw, wb, rb, linear_before_reset, rt, h, y, t, k):
    """Step ``t`` of a GRU once ``a`` (N, 3H) holds the recurrent products and their bias
    ``rb``: of all three gates with ``linear_before_reset``, else of z and r (the hidden gate's
    is added here, from r * h). ``xw`` (T, N, 3H): X W^T, ``wb`` its bias; ``rt`` (H, 3H): R
    transposed; ``h`` (N, H) is updated in place and slot ``k`` of ``y`` (T, D, N, H) written.
    Gates z, r, h."""
    n_rows, g = a.shape
    hid = g // 3
    dirs = y.shape[1]
    one = np.zeros(1, a.dtype)[0] + np.float32(1)
    af, xf, hf, yf = a.reshape(a.size), xw.reshape(xw.size), h.reshape(h.size), y.reshape(y.size)
    for n in range(n_rows):
        ab, xb = n * g, (t * n_rows + n) * g
        for j in range(2 * hid):  # z and r
            af[U(ab + j)] = _sigmoid(xf[U(xb + j)] + wb[U(j)] + af[U(ab + j)])
    if not linear_before_reset:
        u = np.empty((n_rows, hid), a.dtype)  # r * h
        uf = u.reshape(u.size)
        for n in range(n_rows):
            ab, hb = n * g, n * hid
            for j in range(hid):
                af[U(ab + 2 * hid + j)] = rb[U(2 * hid + j)]
                uf[U(hb + j)] = af[U(ab + hid + j)] * hf[U(hb + j)]
        _add_products(a, u, rt, 2 * hid, hid)
    for n in range(n_rows):
        ab, hb, xb = n * g, n * hid, (t * n_rows + n) * g
        yb = ((t * dirs + k) * n_rows + n) * hid
        for j in range(hid):
            xh = xf[U(xb + 2 * hid + j)] + wb[U(2 * hid + j)]
            rec = af[U(ab + 2 * hid + j)]
            r = af[U(ab + hid + j)]
            nv = _tanh(xh + r * rec if linear_before_reset else xh + rec)
            z = af[U(ab + j)]
            hv = (one - z) * nv + z * hf[U(hb + j)]
            hf[U(hb + j)] = hv
            yf[U(yb + j)] = hv


@jit()
def _gru_steps(xw, wb, rb, rt, linear_before_reset, h, y, k, reverse):
    """One direction of a GRU over time, its recurrent products here (see :func:`_gru_gates`;
    ``reverse`` as in :func:`_lstm_steps`)."""
    steps, n_rows, g = xw.shape
    hid = g // 3
    width = g if linear_before_reset else 2 * hid
    a = np.empty((n_rows, g), xw.dtype)
    af = a.reshape(a.size)
    for s in range(steps):
        t = steps - 1 - s if reverse else s
        for n in range(n_rows):
            for j in range(width):
                af[U(n * g + j)] = rb[U(j)]
        _add_products(a, h, rt, 0, width)
        _gru_gates(a, xw, wb, rb, linear_before_reset, rt, h, y, t, k)


def _reference(op: str, *args, **attrs):
    from onemodel.tensors.ops import OPS

    return OPS[op].kernel(*args, **attrs)


def _covered(X, W, R, sequence_lens, activations, clip, hidden_size, gates, dirs, layout,
             optional) -> bool:
    """Whether the loops compute this call as the reference does: every array of the dtype and
    of exactly the shape the op's geometry gives (the loops index flat arrays unchecked, so a
    wrong shape must reach the reference, which names it); the rest goes there too."""
    if dirs is None or layout not in (0, 1) or clip is not None or activations is not None or \
            sequence_lens is not None or X.dtype not in (np.float32, np.float64):
        return False
    if X.ndim != 3 or W.ndim != 3 or R.ndim != 3:
        return False
    batch = X.shape[1] if layout == 0 else X.shape[0]
    hid = R.shape[2]
    if hidden_size is not None and hidden_size != hid:
        return False
    state = (dirs, batch, hid) if layout == 0 else (batch, dirs, hid)
    want = {"W": (dirs, gates * hid, X.shape[2]), "R": (dirs, gates * hid, hid),
            "B": (dirs, 2 * gates * hid), "initial_h": state, "initial_c": state,
            "P": (dirs, 3 * hid)}
    given = {"W": W, "R": R, **optional}
    return all(a is None or (a.shape == want[name] and a.dtype == X.dtype)
               for name, a in given.items())


def _time_major(X, layout):
    return np.ascontiguousarray(X if layout == 0 else X.transpose(1, 0, 2))


def _state(init, k, layout, shape, dtype):
    """Direction ``k``'s starting state as a new (N, H) array (zeros when omitted)."""
    if init is None:
        return np.zeros(shape, dtype)
    return np.array(init[k] if layout == 0 else init[:, k], dtype, order="C")


def _projection(X, Wk):
    """X W^T for every step at once: (T, N, G)."""
    steps, n_rows = X.shape[:2]
    return np.dot(X.reshape(steps * n_rows, X.shape[2]), Wk.T).reshape(steps, n_rows, Wk.shape[0])


def _outputs(Y, states, layout):
    if layout == 1:
        Y = Y.transpose(2, 0, 1, 3)
        states = [s.transpose(1, 0, 2) for s in states]
    return (np.ascontiguousarray(Y), *(np.ascontiguousarray(s) for s in states))


def lstm(X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None, *,
         activation_alpha=None, activation_beta=None, activations=None, clip=None,
         direction="forward", hidden_size=None, input_forget=0, layout=0):
    """ONNX LSTM forward (gates i, o, f, c; peepholes i, o, f)."""
    attrs = dict(activation_alpha=activation_alpha, activation_beta=activation_beta,
                 activations=activations, clip=clip, direction=direction,
                 hidden_size=hidden_size, input_forget=input_forget, layout=layout)
    dirs = {"forward": 1, "reverse": 1, "bidirectional": 2}.get(direction)
    if not _covered(X, W, R, sequence_lens, activations, clip, hidden_size, 4, dirs, layout,
                    dict(B=B, initial_h=initial_h, initial_c=initial_c, P=P)):
        return _reference("LSTM", X, W, R, B, sequence_lens, initial_h, initial_c, P, **attrs)
    x = _time_major(X, layout)
    steps, n_rows = x.shape[:2]
    hid = R.shape[2]
    dt = X.dtype
    Y = np.zeros((steps, dirs, n_rows, hid), dt)
    hs, cs = np.empty((dirs, n_rows, hid), dt), np.empty((dirs, n_rows, hid), dt)
    for k in range(dirs):
        bias = np.zeros(8 * hid, dt) if B is None else np.asarray(B[k], dt)
        bias = np.ascontiguousarray(bias[:4 * hid] + bias[4 * hid:])
        p = np.zeros(3 * hid, dt) if P is None else np.ascontiguousarray(P[k], dt)
        h = _state(initial_h, k, layout, (n_rows, hid), dt)
        c = _state(initial_c, k, layout, (n_rows, hid), dt)
        xw = _projection(x, W[k])
        rt = np.ascontiguousarray(R[k].T)
        backward = direction == "reverse" or k == 1
        _lstm_steps(xw, bias, rt, p, P is not None, bool(input_forget), h, c, Y, k, backward)
        hs[k], cs[k] = h, c
    return _outputs(Y, [hs, cs], layout)


def gru(X, W, R, B=None, sequence_lens=None, initial_h=None, *, activation_alpha=None,
        activation_beta=None, activations=None, clip=None, direction="forward",
        hidden_size=None, layout=0, linear_before_reset=0):
    """ONNX GRU forward (gates z, r, h)."""
    attrs = dict(activation_alpha=activation_alpha, activation_beta=activation_beta,
                 activations=activations, clip=clip, direction=direction,
                 hidden_size=hidden_size, layout=layout, linear_before_reset=linear_before_reset)
    dirs = {"forward": 1, "reverse": 1, "bidirectional": 2}.get(direction)
    if not _covered(X, W, R, sequence_lens, activations, clip, hidden_size, 3, dirs, layout,
                    dict(B=B, initial_h=initial_h)):
        return _reference("GRU", X, W, R, B, sequence_lens, initial_h, **attrs)
    x = _time_major(X, layout)
    steps, n_rows = x.shape[:2]
    hid = R.shape[2]
    dt = X.dtype
    Y = np.zeros((steps, dirs, n_rows, hid), dt)
    hs = np.empty((dirs, n_rows, hid), dt)
    for k in range(dirs):
        bias = np.zeros(6 * hid, dt) if B is None else np.asarray(B[k], dt)
        wb = np.ascontiguousarray(bias[:3 * hid])
        rb = np.ascontiguousarray(bias[3 * hid:])
        h = _state(initial_h, k, layout, (n_rows, hid), dt)
        xw = _projection(x, W[k])
        rt = np.ascontiguousarray(R[k].T)
        backward = direction == "reverse" or k == 1
        _gru_steps(xw, wb, rb, rt, bool(linear_before_reset), h, Y, k, backward)
        hs[k] = h
    return _outputs(Y, [hs], layout)
