"""RNN, LSTM and GRU layers and their cells, with PyTorch's names, shapes and semantics.

Each layer and direction set runs the op set's ONNX ``RNN``/``LSTM``/``GRU`` op once: PyTorch's
gate order is rearranged into ONNX's on the fly (LSTM i, f, g, o -> i, o, f, c; GRU r, z, n ->
z, r, h with ``linear_before_reset=1``, which is PyTorch's GRU), so gradients reach the
PyTorch-shaped parameters and a traced LSTM exports as one ONNX LSTM node per layer with the
sequence and batch axes symbolic.
"""

from __future__ import annotations

import math

from onemodel.tensors import Generator, OneModelError, Tensor, concat
from onemodel.tensors import functional as F
from onemodel.tensors.dispatch import dispatch
from onemodel.tensors.generator import default_generator

from ..module import Module, Parameter

_GATES = {"RNN_TANH": 1, "RNN_RELU": 1, "LSTM": 4, "GRU": 3}
# for each ONNX gate, the PyTorch gate that feeds it
_ORDER = {"LSTM": (0, 3, 1, 2), "GRU": (1, 0, 2)}


def _onnx_op(mode: str) -> str:
    return "RNN" if mode.startswith("RNN") else mode


def _reorder(t: Tensor, mode: str, hidden: int) -> Tensor:
    """PyTorch's gate blocks (rows) in ONNX's order."""
    order = _ORDER.get(mode)
    if order is None:
        return t
    return concat([t[g * hidden:(g + 1) * hidden] for g in order], 0)


def _attrs(mode: str, hidden: int, directions: int) -> dict:
    attrs = {"hidden_size": hidden}
    if directions == 2:
        attrs["direction"] = "bidirectional"
    if mode == "GRU":
        attrs["linear_before_reset"] = 1
    elif mode == "RNN_RELU":
        attrs["activations"] = ("Relu",) * directions
    return attrs


def _uniform(shape, bound: float, generator: Generator | None) -> Parameter:
    g = generator or default_generator()
    return Parameter(g.uniform(shape, -bound, bound))


class _RNNBase(Module):
    """What RNN, LSTM and GRU share: PyTorch's parameters (``weight_ih_l0``, ``weight_hh_l0``,
    ``bias_ih_l0``, ``bias_hh_l0``, ``..._reverse``) and the layer loop."""

    def __init__(self, mode: str, input_size: int, hidden_size: int, num_layers: int = 1,
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0,
                 bidirectional: bool = False, proj_size: int = 0, *,
                 generator: Generator | None = None):
        super().__init__()
        if proj_size:
            raise OneModelError(f"{type(self).__name__}: proj_size is not supported; leave it 0")
        if hidden_size <= 0 or num_layers <= 0 or input_size <= 0:
            raise OneModelError(f"{type(self).__name__}: input_size, hidden_size and num_layers "
                                f"must be positive, got {input_size}, {hidden_size}, {num_layers}")
        if not 0 <= dropout <= 1:
            raise OneModelError(f"dropout must be in [0, 1], got {dropout}")
        self.mode, self.input_size, self.hidden_size = mode, input_size, hidden_size
        self.num_layers, self.bias, self.batch_first = num_layers, bias, batch_first
        self.dropout, self.bidirectional, self.generator = float(dropout), bidirectional, generator
        self.proj_size = 0
        directions = 2 if bidirectional else 1
        gh = _GATES[mode] * hidden_size
        bound = 1 / math.sqrt(hidden_size)  # torch: every parameter ~ U(-1/sqrt(H), 1/sqrt(H))
        for layer in range(num_layers):
            width = input_size if layer == 0 else hidden_size * directions
            for suffix in ("", "_reverse")[:directions]:
                setattr(self, f"weight_ih_l{layer}{suffix}", _uniform((gh, width), bound, generator))
                setattr(self, f"weight_hh_l{layer}{suffix}",
                        _uniform((gh, hidden_size), bound, generator))
                if bias:
                    setattr(self, f"bias_ih_l{layer}{suffix}", _uniform((gh,), bound, generator))
                    setattr(self, f"bias_hh_l{layer}{suffix}", _uniform((gh,), bound, generator))

    def _weights(self, layer: int):
        """ONNX W, R and B of one layer (both directions)."""
        directions = 2 if self.bidirectional else 1
        H = self.hidden_size
        ws, rs, bs = [], [], []
        for suffix in ("", "_reverse")[:directions]:
            ws.append(_reorder(getattr(self, f"weight_ih_l{layer}{suffix}"), self.mode, H))
            rs.append(_reorder(getattr(self, f"weight_hh_l{layer}{suffix}"), self.mode, H))
            if self.bias:
                bs.append(concat([
                    _reorder(getattr(self, f"bias_ih_l{layer}{suffix}"), self.mode, H),
                    _reorder(getattr(self, f"bias_hh_l{layer}{suffix}"), self.mode, H)], 0))

        def stacked(ts):
            return ts[0].unsqueeze(0) if len(ts) == 1 else concat([t.unsqueeze(0) for t in ts], 0)

        return stacked(ws), stacked(rs), stacked(bs) if bs else None

    def _check_state(self, name: str, state: Tensor, batch, batched: bool) -> None:
        directions = 2 if self.bidirectional else 1
        want = (self.num_layers * directions, batch, self.hidden_size) if batched else (
            self.num_layers * directions, self.hidden_size)
        if state.ndim != len(want) or any(isinstance(a, int) and isinstance(b, int) and a != b
                                          for a, b in zip(state.shape, want)):
            raise OneModelError(f"{type(self).__name__}: {name} has shape {list(state.shape)}, "
                                f"expected {list(want)}")

    def _run(self, x: Tensor, h0: Tensor | None, c0: Tensor | None):
        """Run every layer on ``x``; returns (output, h_n, c_n or None)."""
        if x.ndim not in (2, 3):
            raise OneModelError(f"{type(self).__name__}: input must be 2-D (L, H_in) or 3-D, got "
                                f"shape {list(x.shape)}")
        if x.shape[-1] != self.input_size:
            raise OneModelError(f"{type(self).__name__}: input has {x.shape[-1]} features, "
                                f"expected input_size={self.input_size}")
        batched = x.ndim == 3
        if batched and self.batch_first:
            x = x.transpose(0, 1)
        if not batched:
            x = x.unsqueeze(1)
        batch = x.shape[1]
        for name, s in (("h0", h0), ("c0", c0)):
            if s is not None:
                self._check_state(name, s, batch, batched)
        if not batched:
            h0 = None if h0 is None else h0.unsqueeze(1)
            c0 = None if c0 is None else c0.unsqueeze(1)
        directions = 2 if self.bidirectional else 1
        op = _onnx_op(self.mode)
        attrs = _attrs(self.mode, self.hidden_size, directions)
        hs, cs = [], []
        for layer in range(self.num_layers):
            w, r, b = self._weights(layer)
            rows = slice(layer * directions, (layer + 1) * directions)
            inputs = [x, w, r, b, None, None if h0 is None else h0[rows]]
            if op == "LSTM":
                inputs.append(None if c0 is None else c0[rows])
            while inputs[-1] is None:
                inputs.pop()
            outs = dispatch(op, inputs, attrs)
            y = outs[0].transpose(1, 2).flatten(2)  # (T, D, N, H) -> (T, N, D * H)
            hs.append(outs[1])
            if op == "LSTM":
                cs.append(outs[2])
            if layer < self.num_layers - 1 and self.dropout and self.training:
                y = F.dropout(y, self.dropout, True, self.generator)
            x = y
        h_n = hs[0] if len(hs) == 1 else concat(hs, 0)
        c_n = None if not cs else cs[0] if len(cs) == 1 else concat(cs, 0)
        if not batched:
            x, h_n = x.squeeze(1), h_n.squeeze(1)
            c_n = None if c_n is None else c_n.squeeze(1)
        elif self.batch_first:
            x = x.transpose(0, 1)
        return x, h_n, c_n

    def extra_repr(self) -> str:
        text = f"{self.input_size}, {self.hidden_size}"
        if self.num_layers != 1:
            text += f", num_layers={self.num_layers}"
        if not self.bias:
            text += ", bias=False"
        if self.batch_first:
            text += ", batch_first=True"
        if self.dropout:
            text += f", dropout={self.dropout}"
        if self.bidirectional:
            text += ", bidirectional=True"
        return text


class RNN(_RNNBase):
    """``torch.nn.RNN``: ``h_t = tanh(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh)`` (or relu).

    ``forward(input, hx=None)`` returns ``(output, h_n)``."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 nonlinearity: str = "tanh", bias: bool = True, batch_first: bool = False,
                 dropout: float = 0.0, bidirectional: bool = False, *,
                 generator: Generator | None = None):
        if nonlinearity not in ("tanh", "relu"):
            raise OneModelError(f"nonlinearity must be 'tanh' or 'relu', not {nonlinearity!r}")
        super().__init__("RNN_TANH" if nonlinearity == "tanh" else "RNN_RELU", input_size,
                         hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                         generator=generator)
        self.nonlinearity = nonlinearity

    def forward(self, input: Tensor, hx: Tensor | None = None):
        out, h_n, _ = self._run(input, hx, None)
        return out, h_n


class LSTM(_RNNBase):
    """``torch.nn.LSTM`` (gates i, f, g, o; no projection).

    ``forward(input, (h_0, c_0)=None)`` returns ``(output, (h_n, c_n))``."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 proj_size: int = 0, *, generator: Generator | None = None):
        super().__init__("LSTM", input_size, hidden_size, num_layers, bias, batch_first, dropout,
                         bidirectional, proj_size, generator=generator)

    def forward(self, input: Tensor, hx: tuple[Tensor, Tensor] | None = None):
        h0, c0 = (None, None) if hx is None else hx
        if (h0 is None) != (c0 is None):
            raise OneModelError("LSTM: pass both h_0 and c_0 as a tuple (h_0, c_0), or neither")
        out, h_n, c_n = self._run(input, h0, c0)
        return out, (h_n, c_n)


class GRU(_RNNBase):
    """``torch.nn.GRU`` (gates r, z, n; n = tanh(W_in x + b_in + r * (W_hn h + b_hn))).

    ``forward(input, hx=None)`` returns ``(output, h_n)``."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 *, generator: Generator | None = None):
        super().__init__("GRU", input_size, hidden_size, num_layers, bias, batch_first, dropout,
                         bidirectional, generator=generator)

    def forward(self, input: Tensor, hx: Tensor | None = None):
        out, h_n, _ = self._run(input, hx, None)
        return out, h_n


# cells: one time step, the same op on a sequence of length 1 --------------------------------

class _CellBase(Module):
    def __init__(self, mode: str, input_size: int, hidden_size: int, bias: bool,
                 generator: Generator | None):
        super().__init__()
        self.mode, self.input_size, self.hidden_size, self.bias = (mode, input_size, hidden_size,
                                                                   bias)
        gh = _GATES[mode] * hidden_size
        bound = 1 / math.sqrt(hidden_size)
        self.weight_ih = _uniform((gh, input_size), bound, generator)
        self.weight_hh = _uniform((gh, hidden_size), bound, generator)
        if bias:
            self.bias_ih = _uniform((gh,), bound, generator)
            self.bias_hh = _uniform((gh,), bound, generator)
        else:
            self.bias_ih = self.bias_hh = None

    def _step(self, x: Tensor, h: Tensor | None, c: Tensor | None):
        name = type(self).__name__
        if x.ndim not in (1, 2) or x.shape[-1] != self.input_size:
            raise OneModelError(f"{name}: input must be (N, {self.input_size}) or "
                                f"({self.input_size},), got shape {list(x.shape)}")
        batched = x.ndim == 2
        if not batched:
            x = x.unsqueeze(0)
            h = None if h is None else h.unsqueeze(0)
            c = None if c is None else c.unsqueeze(0)
        for what, s in (("hx", h), ("cx", c)):
            if s is not None and (s.ndim != 2 or s.shape[-1] != self.hidden_size):
                raise OneModelError(f"{name}: {what} has shape {list(s.shape)}, expected "
                                    f"(N, {self.hidden_size})")
        H = self.hidden_size
        w = _reorder(self.weight_ih, self.mode, H).unsqueeze(0)
        r = _reorder(self.weight_hh, self.mode, H).unsqueeze(0)
        b = None
        if self.bias:
            b = concat([_reorder(self.bias_ih, self.mode, H),
                        _reorder(self.bias_hh, self.mode, H)], 0).unsqueeze(0)
        op = _onnx_op(self.mode)
        inputs = [x.unsqueeze(0), w, r, b, None, None if h is None else h.unsqueeze(0)]
        if op == "LSTM":
            inputs.append(None if c is None else c.unsqueeze(0))
        while inputs[-1] is None:
            inputs.pop()
        outs = dispatch(op, inputs, _attrs(self.mode, H, 1))
        h_new = outs[1][0]
        c_new = outs[2][0] if op == "LSTM" else None
        if not batched:
            h_new = h_new[0]
            c_new = None if c_new is None else c_new[0]
        return h_new, c_new

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}" + ("" if self.bias else ", bias=False")


class RNNCell(_CellBase):
    """``torch.nn.RNNCell``: ``forward(input, hx=None)`` returns ``h'``."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True,
                 nonlinearity: str = "tanh", *, generator: Generator | None = None):
        if nonlinearity not in ("tanh", "relu"):
            raise OneModelError(f"nonlinearity must be 'tanh' or 'relu', not {nonlinearity!r}")
        super().__init__("RNN_TANH" if nonlinearity == "tanh" else "RNN_RELU", input_size,
                         hidden_size, bias, generator)
        self.nonlinearity = nonlinearity

    def forward(self, input: Tensor, hx: Tensor | None = None) -> Tensor:
        return self._step(input, hx, None)[0]


class LSTMCell(_CellBase):
    """``torch.nn.LSTMCell``: ``forward(input, (h, c)=None)`` returns ``(h', c')``."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, *,
                 generator: Generator | None = None):
        super().__init__("LSTM", input_size, hidden_size, bias, generator)

    def forward(self, input: Tensor, hx: tuple[Tensor, Tensor] | None = None):
        h, c = (None, None) if hx is None else hx
        if (h is None) != (c is None):
            raise OneModelError("LSTMCell: pass both h and c as a tuple (h, c), or neither")
        return self._step(input, h, c)


class GRUCell(_CellBase):
    """``torch.nn.GRUCell``: ``forward(input, hx=None)`` returns ``h'``."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, *,
                 generator: Generator | None = None):
        super().__init__("GRU", input_size, hidden_size, bias, generator)

    def forward(self, input: Tensor, hx: Tensor | None = None) -> Tensor:
        return self._step(input, hx, None)[0]
