"""PyTorch's default initializations, drawn from a OneModel ``Generator`` (same seed, same
weights)."""

from __future__ import annotations

import math

import numpy as np

from onemodel.tensors import Generator, OneModelError, Tensor
from onemodel.tensors.generator import default_generator

from .module import Parameter


def fan_in(shape) -> int:
    """Inputs feeding one output unit: in_features for Linear, in/groups * kernel for Conv."""
    return int(shape[1] * math.prod(shape[2:])) if len(shape) > 1 else int(shape[0])


def uniform(shape, bound: float, generator: Generator | None, dtype=np.float32) -> Parameter:
    g = generator or default_generator()
    return Parameter(g.uniform(shape, -bound, bound).astype(dtype))


def kaiming_uniform(shape, generator: Generator | None, a: float = math.sqrt(5)) -> Parameter:
    """``torch.nn.init.kaiming_uniform_(w, a=sqrt(5))``: the default of Linear and Conv."""
    gain = math.sqrt(2.0 / (1 + a * a))
    bound = gain * math.sqrt(3.0 / fan_in(shape))
    return uniform(shape, bound, generator)


def xavier_uniform(shape, generator: Generator | None) -> Parameter:
    fan_out = int(shape[0] * math.prod(shape[2:]))
    bound = math.sqrt(6.0 / (fan_in(shape) + fan_out))
    return uniform(shape, bound, generator)


def zeros(shape) -> Parameter:
    return Parameter(np.zeros(shape, np.float32))


def ones(shape) -> Parameter:
    return Parameter(np.ones(shape, np.float32))


def normal(shape, generator: Generator | None, std: float = 1.0) -> Parameter:
    g = generator or default_generator()
    return Parameter(g.normal(shape, 0.0, std))


# torch.nn.init's in-place functions, with its names and arguments ------------------------------
# They fill an existing tensor (a layer's parameter) without recording autograd history, as
# torch's do under no_grad. The numbers come from a OneModel Generator, so they follow torch's
# distributions, not its random stream.

def _target(tensor, what: str) -> np.ndarray:
    if not isinstance(tensor, Tensor):
        raise OneModelError(f"init.{what} fills a onemodel Tensor (a Parameter), "
                            f"got {type(tensor).__name__}")
    if tensor._data.dtype.kind != "f":
        raise OneModelError(f"init.{what} fills a floating-point tensor; this one is "
                            f"{tensor.dtype}")
    return tensor._data


def _fill(tensor, values) -> Tensor:
    tensor._data[...] = values
    return tensor


def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    """The gain torch recommends for ``nonlinearity`` (``'relu'``, ``'tanh'``, ``'leaky_relu'``
    with its negative slope ``param``, ...)."""
    linear = ("linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
              "conv_transpose3d", "sigmoid")
    if nonlinearity in linear:
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else float(param)
        return math.sqrt(2.0 / (1 + slope**2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise OneModelError(f"calculate_gain: unknown nonlinearity {nonlinearity!r}")


def _fans(shape, what: str) -> tuple[int, int]:
    if len(shape) < 2:
        raise OneModelError(f"init.{what}: fan in and fan out need a tensor of rank >= 2 "
                            f"(a weight), got shape {list(shape)}")
    rf = math.prod(shape[2:])
    return int(shape[1] * rf), int(shape[0] * rf)


def _gen(generator: Generator | None) -> Generator:
    return generator or default_generator()


def uniform_(tensor, a: float = 0.0, b: float = 1.0, generator: Generator | None = None):
    d = _target(tensor, "uniform_")
    return _fill(tensor, _gen(generator).uniform(d.shape, a, b, d.dtype))


def normal_(tensor, mean: float = 0.0, std: float = 1.0, generator: Generator | None = None):
    d = _target(tensor, "normal_")
    return _fill(tensor, _gen(generator).normal(d.shape, mean, std, d.dtype))


def constant_(tensor, val: float):
    _target(tensor, "constant_")
    return _fill(tensor, val)


def zeros_(tensor):
    _target(tensor, "zeros_")
    return _fill(tensor, 0)


def ones_(tensor):
    _target(tensor, "ones_")
    return _fill(tensor, 1)


def eye_(tensor):
    """The identity matrix in a 2-D tensor."""
    d = _target(tensor, "eye_")
    if d.ndim != 2:
        raise OneModelError(f"init.eye_ fills a 2-D tensor, got shape {list(d.shape)}")
    return _fill(tensor, np.eye(*d.shape, dtype=d.dtype))


def xavier_uniform_(tensor, gain: float = 1.0, generator: Generator | None = None):
    d = _target(tensor, "xavier_uniform_")
    fi, fo = _fans(d.shape, "xavier_uniform_")
    bound = math.sqrt(3.0) * gain * math.sqrt(2.0 / (fi + fo))
    return _fill(tensor, _gen(generator).uniform(d.shape, -bound, bound, d.dtype))


def xavier_normal_(tensor, gain: float = 1.0, generator: Generator | None = None):
    d = _target(tensor, "xavier_normal_")
    fi, fo = _fans(d.shape, "xavier_normal_")
    std = gain * math.sqrt(2.0 / (fi + fo))
    return _fill(tensor, _gen(generator).normal(d.shape, 0.0, std, d.dtype))


def _kaiming_std(d, a, mode, nonlinearity, what) -> float:
    if mode not in ("fan_in", "fan_out"):
        raise OneModelError(f"init.{what}: mode is 'fan_in' or 'fan_out', got {mode!r}")
    fi, fo = _fans(d.shape, what)
    fan = fi if mode == "fan_in" else fo
    if fan == 0:
        raise OneModelError(f"init.{what}: a tensor of shape {list(d.shape)} has no fan")
    return calculate_gain(nonlinearity, a) / math.sqrt(fan)


def kaiming_uniform_(tensor, a: float = 0.0, mode: str = "fan_in",
                     nonlinearity: str = "leaky_relu", generator: Generator | None = None):
    d = _target(tensor, "kaiming_uniform_")
    bound = math.sqrt(3.0) * _kaiming_std(d, a, mode, nonlinearity, "kaiming_uniform_")
    return _fill(tensor, _gen(generator).uniform(d.shape, -bound, bound, d.dtype))


def kaiming_normal_(tensor, a: float = 0.0, mode: str = "fan_in",
                    nonlinearity: str = "leaky_relu", generator: Generator | None = None):
    d = _target(tensor, "kaiming_normal_")
    std = _kaiming_std(d, a, mode, nonlinearity, "kaiming_normal_")
    return _fill(tensor, _gen(generator).normal(d.shape, 0.0, std, d.dtype))


def trunc_normal_(tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0, b: float = 2.0,
                  generator: Generator | None = None):
    """Normal(mean, std) restricted to ``[a, b]`` (absolute bounds, as in torch), by redrawing
    the samples that fall outside."""
    d = _target(tensor, "trunc_normal_")
    if not a < b:
        raise OneModelError(f"init.trunc_normal_: needs a < b, got a={a}, b={b}")
    cdf = lambda x: 0.5 * (1 + math.erf((x - mean) / (std * math.sqrt(2))))
    if cdf(b) - cdf(a) < 1e-4:
        raise OneModelError(f"init.trunc_normal_: [{a}, {b}] holds under 1e-4 of the mass of "
                            f"Normal({mean}, {std}); move the bounds nearer the mean")
    g = _gen(generator)
    out = g.normal(d.shape, mean, std, np.float64).reshape(-1)
    bad = np.flatnonzero((out < a) | (out > b))
    while bad.size:
        out[bad] = g.normal((bad.size,), mean, std, np.float64)
        bad = bad[(out[bad] < a) | (out[bad] > b)]
    return _fill(tensor, out.reshape(d.shape).astype(d.dtype))


def orthogonal_(tensor, gain: float = 1.0, generator: Generator | None = None):
    """A (semi-)orthogonal matrix, the tensor seen as ``(shape[0], rest)``: QR of a Gaussian
    matrix with the signs fixed so the result is uniform over orthogonal matrices."""
    d = _target(tensor, "orthogonal_")
    if d.ndim < 2:
        raise OneModelError(f"init.orthogonal_ needs a tensor of rank >= 2, got shape "
                            f"{list(d.shape)}")
    rows = d.shape[0]
    cols = d.size // rows if rows else 0
    flat = _gen(generator).normal((rows, cols), 0.0, 1.0, np.float64)
    if rows < cols:
        flat = flat.T
    q, r = np.linalg.qr(flat)
    q = q * np.sign(np.diag(r))
    if rows < cols:
        q = q.T
    return _fill(tensor, (gain * q).reshape(d.shape).astype(d.dtype))
