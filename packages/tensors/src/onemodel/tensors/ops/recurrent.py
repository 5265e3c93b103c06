"""Recurrent ops with ONNX semantics and gate orders: RNN, GRU, LSTM (opset 14/22 forms).

Gate orders are ONNX's: LSTM ``i, o, f, c`` (peepholes ``i, o, f``), GRU ``z, r, h``. One numpy
core runs a direction over time for all three; ``reverse`` runs the same core on each sequence
reversed within its ``sequence_lens``. Steps past a sequence's length leave the state unchanged
and write zeros to ``Y``, so ``Y_h``/``Y_c`` hold the state after each sequence's last step (zeros
for a sequence of length 0, as onnxruntime gives).

Gradients: back-propagation through time in the internal ops ``RNNGrad``, ``GRUGrad`` and
``LSTMGrad`` (domain ``onemodel``), which recompute the forward pass and return gradients for X,
W, R, B, initial_h, initial_c and the peepholes P. ``sequence_lens`` is integer data and has no
gradient.
"""

from __future__ import annotations

import numpy as np

from ..dtype import FLOATING, INTEGER
from ..errors import ShapeError
from ..symbolic import format_shape, mul
from ._grad import call
from .base import TensorSpec, defop, same_dtype

_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
_DEFAULT_ACTS = {"RNN": ("Tanh",), "GRU": ("Sigmoid", "Tanh"), "LSTM": ("Sigmoid", "Tanh", "Tanh")}
_DIRECTIONS = {"forward": 1, "reverse": 1, "bidirectional": 2}


# activations: value and derivative of the pre-activation z ------------------------------------

def _sigmoid(z):
    """1 / (1 + exp(-z)) as 0.5 * (1 + tanh(z / 2)): one transcendental, no overflow."""
    out = np.multiply(z, 0.5, dtype=z.dtype)
    np.tanh(out, out=out)
    out += 1
    out *= 0.5
    return out


def _d_sigmoid(z, a, b):
    s = _sigmoid(z)
    return s * (1 - s)


def _hard_sigmoid(z, a, b):
    return np.clip(a * z + b, 0, 1).astype(z.dtype, copy=False)


# name -> (takes alpha, takes beta, default alpha, default beta, f, f')
_ACTS = {
    "relu": (False, False, 0.0, 0.0, lambda z, a, b: np.maximum(z, 0),
             lambda z, a, b: (z > 0).astype(z.dtype)),
    "tanh": (False, False, 0.0, 0.0, lambda z, a, b: np.tanh(z),
             lambda z, a, b: 1 - np.tanh(z) ** 2),
    "sigmoid": (False, False, 0.0, 0.0, lambda z, a, b: _sigmoid(z), _d_sigmoid),
    "affine": (True, True, 1.0, 0.0, lambda z, a, b: a * z + b,
               lambda z, a, b: np.full_like(z, a)),
    "leakyrelu": (True, False, 0.01, 0.0, lambda z, a, b: np.where(z >= 0, z, a * z),
                  lambda z, a, b: np.where(z >= 0, 1, a).astype(z.dtype)),
    "thresholdedrelu": (True, False, 1.0, 0.0, lambda z, a, b: np.where(z > a, z, 0),
                        lambda z, a, b: (z > a).astype(z.dtype)),
    "scaledtanh": (True, True, 1.0, 1.0, lambda z, a, b: a * np.tanh(b * z),
                   lambda z, a, b: a * b * (1 - np.tanh(b * z) ** 2)),
    "hardsigmoid": (True, True, 0.2, 0.5, _hard_sigmoid,
                    lambda z, a, b: np.where((a * z + b > 0) & (a * z + b < 1), a, 0)
                    .astype(z.dtype)),
    "elu": (True, False, 1.0, 0.0, lambda z, a, b: np.where(z >= 0, z, a * (np.exp(z) - 1)),
            lambda z, a, b: np.where(z >= 0, 1, a * np.exp(z)).astype(z.dtype)),
    "softsign": (False, False, 0.0, 0.0, lambda z, a, b: z / (1 + np.abs(z)),
                 lambda z, a, b: 1 / (1 + np.abs(z)) ** 2),
    "softplus": (False, False, 0.0, 0.0, lambda z, a, b: np.logaddexp(z, 0).astype(z.dtype),
                 lambda z, a, b: _sigmoid(z)),
}


class _Act:
    __slots__ = ("a", "b", "df", "f", "kind", "name")

    def __init__(self, name: str, a: float, b: float):
        spec = _ACTS[name.lower()]
        self.name, self.a, self.b, self.f, self.df = name, a, b, spec[4], spec[5]
        self.kind = name.lower()

    def __call__(self, z):
        return self.f(z, self.a, self.b).astype(z.dtype, copy=False)

    def grad(self, z, y):
        """f'(z), where ``y`` = f(z) (sigmoid and tanh read their derivative from it)."""
        if self.kind == "sigmoid":
            return y * (1 - y)
        if self.kind == "tanh":
            return 1 - y * y
        return self.df(z, self.a, self.b).astype(z.dtype, copy=False)


def _activations(kind, activations, alphas, betas, num_dir) -> list[tuple[_Act, ...]]:
    """The activations of each direction. ``activation_alpha``/``beta`` are consumed in order by
    the activations that take them (as in onnxruntime); a list for one direction of a
    bidirectional op serves both."""
    per = len(_DEFAULT_ACTS[kind])
    names = tuple(activations) if activations else _DEFAULT_ACTS[kind] * num_dir
    if num_dir == 2 and len(names) == per:
        names = names * 2
    if len(names) != per * num_dir:
        raise ValueError(f"{kind} needs {per * num_dir} activations for {num_dir} direction(s), "
                         f"got {len(names)} ({', '.join(names)})")
    alphas, betas = list(alphas or ()), list(betas or ())
    out, ai, bi = [], 0, 0
    for name in names:
        spec = _ACTS.get(str(name).lower())
        if spec is None:
            raise ValueError(f"activation {name!r} is not one of "
                             "Relu, Tanh, Sigmoid, Affine, LeakyRelu, ThresholdedRelu, "
                             "ScaledTanh, HardSigmoid, Elu, Softsign, Softplus")
        a, b = spec[2], spec[3]
        if spec[0] and ai < len(alphas):
            a, ai = float(alphas[ai]), ai + 1
        if spec[1] and bi < len(betas):
            b, bi = float(betas[bi]), bi + 1
        out.append(_Act(str(name), a, b))
    return [tuple(out[d * per:(d + 1) * per]) for d in range(num_dir)]


# shape rules -----------------------------------------------------------------------------------

def _known(d) -> bool:
    return isinstance(d, int)


def _check_dim(what, spec, axis, want):
    got = spec.shape[axis]
    if _known(got) and _known(want) and got != want:
        raise ShapeError(f"{what} has shape {format_shape(spec.shape)}; axis {axis} must be {want}")


def _geometry(kind, specs, direction, hidden_size, layout):
    """(seq, batch, input, hidden, directions, dtype) from the input specs, checking every
    input's shape against them."""
    x, w, r = specs[0], specs[1], specs[2]
    if x is None or w is None or r is None:
        raise ShapeError(f"{kind} needs X, W and R")
    if direction not in _DIRECTIONS:
        raise ShapeError(f"direction must be forward, reverse or bidirectional, not {direction!r}")
    if layout not in (0, 1):
        raise ShapeError(f"layout must be 0 or 1, not {layout!r}")
    nd = _DIRECTIONS[direction]
    g = _GATES[kind]
    for name, s in (("X", x), ("W", w), ("R", r)):
        if len(s.shape) != 3:
            raise ShapeError(f"{name} must have rank 3, got {format_shape(s.shape)}")
    dt = same_dtype([x, w, r], FLOATING)
    seq, batch = (x.shape[0], x.shape[1]) if layout == 0 else (x.shape[1], x.shape[0])
    hid = r.shape[2]
    if hidden_size is not None:
        if _known(hid) and hid != hidden_size:
            raise ShapeError(f"R has shape {format_shape(r.shape)}, but hidden_size is "
                             f"{hidden_size}; R must be [{nd}, {g * hidden_size}, {hidden_size}]")
        hid = hidden_size
    gh = mul(hid, g)
    _check_dim("W", w, 0, nd)
    _check_dim("W", w, 1, gh)
    _check_dim("W", w, 2, x.shape[2])
    _check_dim("R", r, 0, nd)
    _check_dim("R", r, 1, gh)
    extra = [("B", 3, (nd, mul(gh, 2))), ("sequence_lens", 4, (batch,)),
             ("initial_h", 5, (nd, batch, hid) if layout == 0 else (batch, nd, hid))]
    if kind == "LSTM":
        extra += [("initial_c", 6, extra[2][2]), ("P", 7, (nd, mul(hid, 3)))]
    for name, pos, want in extra:
        s = specs[pos] if pos < len(specs) else None
        if s is None:
            continue
        if len(s.shape) != len(want) or any(
                _known(a) and _known(b) and a != b for a, b in zip(s.shape, want)):
            raise ShapeError(f"{name} has shape {format_shape(s.shape)}; it must be "
                             f"{format_shape(want)}")
        if name == "sequence_lens":
            if s.dtype not in INTEGER:
                raise ShapeError(f"sequence_lens must be int32, got {s.dtype.name}")
        elif s.dtype is not dt:
            raise ShapeError(f"{name} is {s.dtype.name} but X is {dt.name}; cast one of them")
    return seq, batch, x.shape[2], hid, nd, dt


def _state_shape(seq, batch, hid, nd, layout):
    return (nd, batch, hid) if layout == 0 else (batch, nd, hid)


def _forward_shape(kind):
    def rule(specs, *, activation_alpha=None, activation_beta=None, activations=None, clip=None,
             direction="forward", hidden_size=None, layout=0, input_forget=0,
             linear_before_reset=0):
        seq, batch, _, hid, nd, dt = _geometry(kind, specs, direction, hidden_size, layout)
        _activations(kind, activations, activation_alpha, activation_beta, nd)
        y = (seq, nd, batch, hid) if layout == 0 else (batch, seq, nd, hid)
        state = TensorSpec(_state_shape(seq, batch, hid, nd, layout), dt)
        out = [TensorSpec(y, dt), state]
        return out + [state] if kind == "LSTM" else out

    return rule


def _grad_shape(kind):
    n_in = 8 if kind == "LSTM" else 6

    def rule(specs, **attrs):
        if any(s is None for s in specs[n_in:]) or len(specs) < n_in + (3 if kind == "LSTM" else 2):
            raise ShapeError(f"{kind}Grad needs the gradient of every output")
        seq, batch, _, hid, nd, dt = _geometry(kind, specs, attrs.get("direction", "forward"),
                                                 attrs.get("hidden_size"),
                                                 attrs.get("layout", 0))
        g = _GATES[kind]
        state = TensorSpec(_state_shape(seq, batch, hid, nd, attrs.get("layout", 0)), dt)
        out = [TensorSpec(specs[0].shape, dt), TensorSpec(specs[1].shape, dt),
               TensorSpec(specs[2].shape, dt), TensorSpec((nd, mul(hid, 2 * g)), dt), state]
        if kind == "LSTM":
            out += [state, TensorSpec((nd, mul(hid, 3)), dt)]
        return out

    return rule


# the numpy core: one direction, time-major, with an optional validity mask ---------------------

def _clip(a, clip):
    return a if clip is None else np.clip(a, -clip, clip)


def _dclip(a, clip):
    """The pre-activation's gradient through the clip (1 inside, 0 outside)."""
    return 1 if clip is None else (np.abs(a) <= clip)


class _Dir:
    """One direction's parameters and settings."""

    def __init__(self, kind, w, r, b, p, acts, clip, lbr, input_forget):
        gh = w.shape[0]
        self.kind, self.w, self.r, self.acts, self.clip = kind, w, r, acts, clip
        self.h = r.shape[1]
        self.wb = b[:gh] if b is not None else np.zeros(gh, w.dtype)
        self.rb = b[gh:] if b is not None else np.zeros(gh, w.dtype)
        self.p = p
        self.lbr, self.input_forget = lbr, input_forget

    def step(self, xw, h, c):
        """One time step on the projected input ``xw``: (new h, new c, what backward needs)."""
        H, clip, f = self.h, self.clip, self.acts[0]
        if self.kind == "RNN":
            a = xw + h @ self.r.T + self.rb
            hn = f(_clip(a, clip))
            return hn, None, (a, hn)
        if self.kind == "GRU":
            g = self.acts[1]
            hzr = h @ self.r[:2 * H].T + self.rb[:2 * H]
            az, ar = xw[:, :H] + hzr[:, :H], xw[:, H:2 * H] + hzr[:, H:]
            z, rr = f(_clip(az, clip)), f(_clip(ar, clip))
            if self.lbr:
                hh = h @ self.r[2 * H:].T + self.rb[2 * H:]
                ah = xw[:, 2 * H:] + rr * hh
            else:
                hh = None
                ah = xw[:, 2 * H:] + (rr * h) @ self.r[2 * H:].T + self.rb[2 * H:]
            n = g(_clip(ah, clip))
            return (1 - z) * n + z * h, None, (az, ar, ah, z, rr, n, hh)
        g, hact = self.acts[1], self.acts[2]
        a = xw + h @ self.r.T + self.rb
        ai, ao, af, ac = a[:, :H], a[:, H:2 * H], a[:, 2 * H:3 * H], a[:, 3 * H:]
        if self.p is not None:
            ai = ai + self.p[:H] * c
            af = af + self.p[2 * H:] * c
        i = f(_clip(ai, clip))
        fg = 1 - i if self.input_forget else f(_clip(af, clip))
        cc = g(_clip(ac, clip))
        cn = fg * c + i * cc
        if self.p is not None:
            ao = ao + self.p[H:2 * H] * cn
        o = f(_clip(ao, clip))
        hc = hact(cn)
        return o * hc, cn, (ai, ao, af, ac, i, fg, cc, o, cn, hc)

    def back(self, rec, h, c, dh, dc, grads):
        """Gradients of one step: returns (d pre-activations of the input side, dh_prev,
        dc_prev); adds the recurrent side's parameter gradients into ``grads``."""
        H, clip, f = self.h, self.clip, self.acts[0]
        dR, dRb, dP = grads
        if self.kind == "RNN":
            a, hn = rec
            da = dh * f.grad(_clip(a, clip), hn) * _dclip(a, clip)
            dR += da.T @ h
            dRb += da.sum(0)
            return da, da @ self.r, None
        if self.kind == "GRU":
            g = self.acts[1]
            az, ar, ah, z, rr, n, hh = rec
            dz = dh * (h - n)
            dn = dh * (1 - z)
            dh_prev = dh * z
            dah = dn * g.grad(_clip(ah, clip), n) * _dclip(ah, clip)
            rh = self.r[2 * H:]
            if self.lbr:
                dr = dah * hh
                dhh = dah * rr
                dR[2 * H:] += dhh.T @ h
                dRb[2 * H:] += dhh.sum(0)
                dh_prev += dhh @ rh
            else:
                u = rr * h
                du = dah @ rh
                dR[2 * H:] += dah.T @ u
                dRb[2 * H:] += dah.sum(0)
                dr = du * h
                dh_prev += du * rr
            daz = dz * f.grad(_clip(az, clip), z) * _dclip(az, clip)
            dar = dr * f.grad(_clip(ar, clip), rr) * _dclip(ar, clip)
            dzr = np.concatenate([daz, dar], axis=1)
            dR[:2 * H] += dzr.T @ h
            dRb[:2 * H] += dzr.sum(0)
            dh_prev += dzr @ self.r[:2 * H]
            return np.concatenate([dzr, dah], axis=1), dh_prev, None
        g, hact = self.acts[1], self.acts[2]
        ai, ao, af, ac, i, fg, cc, o, cn, hc = rec
        dao = dh * hc * f.grad(_clip(ao, clip), o) * _dclip(ao, clip)
        dct = dc + dh * o * hact.grad(cn, hc)
        if self.p is not None:
            dct = dct + dao * self.p[H:2 * H]
        di = dct * cc
        dfg = dct * c
        dcc = dct * i
        if self.input_forget:
            di = di - dfg
            daf = np.zeros_like(dfg)
        else:
            daf = dfg * f.grad(_clip(af, clip), fg) * _dclip(af, clip)
        dai = di * f.grad(_clip(ai, clip), i) * _dclip(ai, clip)
        dac = dcc * g.grad(_clip(ac, clip), cc) * _dclip(ac, clip)
        dc_prev = dct * fg
        if self.p is not None:
            dc_prev = dc_prev + dai * self.p[:H] + daf * self.p[2 * H:]
            dP[:H] += (dai * c).sum(0)
            dP[H:2 * H] += (dao * cn).sum(0)
            dP[2 * H:] += (daf * c).sum(0)
        da = np.concatenate([dai, dao, daf, dac], axis=1)
        dR += da.T @ h
        dRb += da.sum(0)
        return da, da @ self.r, dc_prev


def _run_direction(d: _Dir, x, h0, c0, mask, keep):
    """Run over time-major ``x`` (T, N, I): (Y (T, N, H), last h, last c, tape)."""
    T, N = x.shape[:2]
    xw = x @ d.w.T + d.wb if T else np.zeros((0, N, d.w.shape[0]), x.dtype)
    y = np.zeros((T, N, d.h), x.dtype)
    h, c = h0, c0
    tape = []
    for t in range(T):
        hn, cn, rec = d.step(xw[t], h, c)
        if keep:
            tape.append((rec, h, c))
        if mask is not None:
            m = mask[t][:, None]
            hn = np.where(m, hn, h)
            if cn is not None:
                cn = np.where(m, cn, c)
            y[t] = np.where(m, hn, 0)
        else:
            y[t] = hn
        h, c = hn, cn
    return y, h, c, tape


def _back_direction(d: _Dir, x, tape, mask, dy, dh_last, dc_last):
    """Back-propagation through time: (dX, dW, dR, dB, dh0, dc0, dP) of one direction."""
    T, N = x.shape[:2]
    dR, dRb = np.zeros_like(d.r), np.zeros(d.r.shape[0], x.dtype)
    dP = np.zeros(3 * d.h, x.dtype)
    dxw = np.zeros((T, N, d.w.shape[0]), x.dtype)
    dh = dh_last.copy()
    dc = dc_last.copy() if dc_last is not None else None
    for t in range(T - 1, -1, -1):
        rec, h, c = tape[t]
        if mask is None:
            da, dh_prev, dc_prev = d.back(rec, h, c, dh + dy[t], dc, (dR, dRb, dP))
        else:
            m = mask[t][:, None]
            total = dh + dy[t] * m
            da, dh_prev, dc_prev = d.back(rec, h, c, total * m,
                                          None if dc is None else dc * m, (dR, dRb, dP))
            dh_prev = dh_prev + total * ~m
            if dc is not None:
                dc_prev = dc_prev + dc * ~m
        dxw[t] = da
        dh, dc = dh_prev, dc_prev
    flat = dxw.reshape(T * N, -1)
    dX = (flat @ d.w).reshape(T, N, -1)
    dW = flat.T @ x.reshape(T * N, -1) if T * N else np.zeros_like(d.w)
    dB = np.concatenate([flat.sum(0), dRb])
    return dX, dW, dR, dB, dh, dc, dP


def _reverse_index(lens, T):
    """Per batch item, the time index that reverses the first ``lens[b]`` steps (an
    involution: the same index maps back)."""
    t = np.arange(T)[:, None]
    return np.where(t < lens[None, :], lens[None, :] - 1 - t, t)


def _run(kind, X, W, R, B, sequence_lens, initial_h, initial_c, P, attrs, grads=None):
    """Forward outputs of ``kind``, or with ``grads`` (dY, dY_h, dY_c) the input gradients."""
    direction = attrs.get("direction", "forward")
    layout = attrs.get("layout", 0)
    nd = _DIRECTIONS.get(direction)
    if nd is None:
        raise ValueError(f"direction must be forward, reverse or bidirectional, not {direction!r}")
    acts = _activations(kind, attrs.get("activations"), attrs.get("activation_alpha"),
                        attrs.get("activation_beta"), nd)
    clip = attrs.get("clip")
    out_dtype = X.dtype
    ct = np.float32 if X.dtype == np.float16 else X.dtype

    def prep(a):
        return None if a is None else np.asarray(a, ct)

    X, W, R, B, initial_h, initial_c, P = map(prep, (X, W, R, B, initial_h, initial_c, P))
    if layout == 1:
        X = X.transpose(1, 0, 2)
        initial_h = None if initial_h is None else initial_h.transpose(1, 0, 2)
        initial_c = None if initial_c is None else initial_c.transpose(1, 0, 2)
    T, N = X.shape[:2]
    H = R.shape[2]
    hidden = attrs.get("hidden_size")
    if hidden is not None and hidden != H:
        raise ValueError(f"hidden_size is {hidden} but R has shape {list(R.shape)}")
    lens = None
    if sequence_lens is not None:
        lens = np.asarray(sequence_lens).astype(np.int64).reshape(-1)
        if lens.shape != (N,) or (lens < 0).any() or (lens > T).any():
            raise ValueError(f"sequence_lens {lens.tolist()} must hold {N} lengths in [0, {T}]")
        if (lens == T).all():
            lens = None
    mask = None if lens is None else np.arange(T)[:, None] < lens[None, :]
    # as onnxruntime: a sequence of length 0 has zero Y_h and Y_c (not its initial state)
    live = None if lens is None or (lens > 0).all() else (lens > 0)[:, None]
    rev = None if lens is None else _reverse_index(lens, T)
    cols = np.arange(N)[None, :]
    if grads is not None:
        dY, dYh, dYc = (None if g is None else np.asarray(g, ct) for g in grads)
        if layout == 1:
            dY = dY.transpose(1, 2, 0, 3)
            dYh = dYh.transpose(1, 0, 2)
            dYc = None if dYc is None else dYc.transpose(1, 0, 2)
        outs = [np.zeros_like(X), np.zeros_like(W), np.zeros_like(R),
                np.zeros((nd, 2 * W.shape[1]), ct), np.zeros((nd, N, H), ct),
                np.zeros((nd, N, H), ct), np.zeros((nd, 3 * H), ct)]
    Y = np.zeros((T, nd, N, H), ct)
    Yh = np.zeros((nd, N, H), ct)
    Yc = np.zeros((nd, N, H), ct)
    for k in range(nd):
        backward = direction == "reverse" or k == 1
        d = _Dir(kind, W[k], R[k], None if B is None else B[k], None if P is None else P[k],
                 acts[k], clip, attrs.get("linear_before_reset", 0), attrs.get("input_forget", 0))
        x = X
        if backward:
            x = X[::-1] if rev is None else X[rev, cols]
        h0 = np.zeros((N, H), ct) if initial_h is None else initial_h[k]
        c0 = None
        if kind == "LSTM":
            c0 = np.zeros((N, H), ct) if initial_c is None else initial_c[k]
        y, h, c, tape = _run_direction(d, x, h0, c0, mask, grads is not None)
        if grads is None:
            Y[:, k] = (y[::-1] if rev is None else y[rev, cols]) if backward else y
            Yh[k] = h if live is None else h * live
            if c is not None:
                Yc[k] = c if live is None else c * live
            continue
        dy = dY[:, k]
        if backward:
            dy = dy[::-1] if rev is None else dy[rev, cols]
        dh_last = dYh[k] if live is None else dYh[k] * live
        dc_last = None if kind != "LSTM" else dYc[k] if live is None else dYc[k] * live
        res = _back_direction(d, x, tape, mask, dy, dh_last, dc_last)
        dx = res[0]
        if backward:
            dx = dx[::-1] if rev is None else dx[rev, cols]
        outs[0] += dx
        outs[1][k], outs[2][k], outs[3][k], outs[4][k] = res[1:5]
        if kind == "LSTM":
            outs[5][k], outs[6][k] = res[5], res[6]
    if grads is not None:
        if layout == 1:
            outs[0] = outs[0].transpose(1, 0, 2)
            outs[4] = outs[4].transpose(1, 0, 2)
            outs[5] = outs[5].transpose(1, 0, 2)
        outs = outs if kind == "LSTM" else outs[:5]
        return tuple(np.ascontiguousarray(o.astype(out_dtype, copy=False)) for o in outs)
    if layout == 1:
        Y, Yh, Yc = Y.transpose(2, 0, 1, 3), Yh.transpose(1, 0, 2), Yc.transpose(1, 0, 2)
    res = (Y, Yh, Yc) if kind == "LSTM" else (Y, Yh)
    return tuple(np.ascontiguousarray(o.astype(out_dtype, copy=False)) for o in res)


def _grad_rule(kind):
    n_in = 8 if kind == "LSTM" else 6

    def rule(ctx, *gouts):
        ins = list(ctx.inputs) + [None] * (n_in - len(ctx.inputs))
        res = call(f"{kind}Grad", *ins, *gouts, **ctx.attrs)
        # input -> its gradient among (dX, dW, dR, dB, dh0[, dc0, dP]); sequence_lens has none
        mapping = [0, 1, 2, 3, None, 4] + ([5, 6] if kind == "LSTM" else [])
        return tuple(None if t is None or j is None or not t.requires_grad else res[j]
                     for t, j in zip(ins, mapping))

    return rule


# the ops -----------------------------------------------------------------------------------------

@defop("RNN", shape=_forward_shape("RNN"), grad=_grad_rule("RNN"), outputs=("Y", "Y_h"))
def rnn(X, W, R, B=None, sequence_lens=None, initial_h=None, *, activation_alpha=None,
        activation_beta=None, activations=None, clip=None, direction="forward",
        hidden_size=None, layout=0):
    """ONNX RNN: ``H_t = f(X_t W^T + H_{t-1} R^T + Wb + Rb)``."""
    return _run("RNN", X, W, R, B, sequence_lens, initial_h, None, None, locals())


@defop("GRU", shape=_forward_shape("GRU"), grad=_grad_rule("GRU"), outputs=("Y", "Y_h"))
def gru(X, W, R, B=None, sequence_lens=None, initial_h=None, *, activation_alpha=None,
        activation_beta=None, activations=None, clip=None, direction="forward",
        hidden_size=None, layout=0, linear_before_reset=0):
    """ONNX GRU (gates z, r, h); ``linear_before_reset=1`` is PyTorch's form."""
    return _run("GRU", X, W, R, B, sequence_lens, initial_h, None, None, locals())


@defop("LSTM", shape=_forward_shape("LSTM"), grad=_grad_rule("LSTM"),
       outputs=("Y", "Y_h", "Y_c"))
def lstm(X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None, *,
         activation_alpha=None, activation_beta=None, activations=None, clip=None,
         direction="forward", hidden_size=None, input_forget=0, layout=0):
    """ONNX LSTM (gates i, o, f, c; peepholes P = i, o, f)."""
    return _run("LSTM", X, W, R, B, sequence_lens, initial_h, initial_c, P, locals())


@defop("RNNGrad", shape=_grad_shape("RNN"), domain="onemodel", traceable=False,
       outputs=("dX", "dW", "dR", "dB", "dinitial_h"))
def rnn_grad(X, W, R, B=None, sequence_lens=None, initial_h=None, dY=None, dY_h=None, *,
             activation_alpha=None, activation_beta=None, activations=None, clip=None,
             direction="forward", hidden_size=None, layout=0):
    """Gradients of RNN (back-propagation through time; the forward pass is recomputed)."""
    a = dict(locals())
    return _run("RNN", X, W, R, B, sequence_lens, initial_h, None, None, a, (dY, dY_h, None))


@defop("GRUGrad", shape=_grad_shape("GRU"), domain="onemodel", traceable=False,
       outputs=("dX", "dW", "dR", "dB", "dinitial_h"))
def gru_grad(X, W, R, B=None, sequence_lens=None, initial_h=None, dY=None, dY_h=None, *,
             activation_alpha=None, activation_beta=None, activations=None, clip=None,
             direction="forward", hidden_size=None, layout=0, linear_before_reset=0):
    """Gradients of GRU (back-propagation through time; the forward pass is recomputed)."""
    a = dict(locals())
    return _run("GRU", X, W, R, B, sequence_lens, initial_h, None, None, a, (dY, dY_h, None))


@defop("LSTMGrad", shape=_grad_shape("LSTM"), domain="onemodel", traceable=False,
       outputs=("dX", "dW", "dR", "dB", "dinitial_h", "dinitial_c", "dP"))
def lstm_grad(X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None,
              dY=None, dY_h=None, dY_c=None, *, activation_alpha=None, activation_beta=None,
              activations=None, clip=None, direction="forward", hidden_size=None,
              input_forget=0, layout=0):
    """Gradients of LSTM (back-propagation through time; the forward pass is recomputed)."""
    a = dict(locals())
    return _run("LSTM", X, W, R, B, sequence_lens, initial_h, initial_c, P, a, (dY, dY_h, dY_c))
