"""Signal-processing ops: DFT, STFT, window functions, mel weight matrices.

Complex values follow ONNX's layout: a last axis of 2 (real, imaginary); a last axis of 1 is a
real signal. Kernels compute in numpy's FFT and return the input's element type."""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..dtype import FLOATING, INTEGER, DType
from ..errors import ShapeError
from ..symbolic import add, floordiv, mul
from .adapters import ImportNode, onnx_adapter
from .base import TensorSpec, const_ints, defop, same_dtype

# DFT -------------------------------------------------------------------------------------------


def _scalar(spec, what):
    """The value of a scalar (or one-element) integer input the shape rule needs."""
    if spec is None:
        return None
    if spec.dtype not in INTEGER:
        raise ShapeError(f"{what} must be an integer scalar, got {spec}")
    value = const_ints(spec, what)
    if len(value) != 1:
        raise ShapeError(f"{what} must be a scalar, got {len(value)} values")
    return value[0]


def _dft_axis(axis, rank):
    if not (-rank <= axis <= -2 or 0 <= axis <= rank - 2):
        raise ShapeError(f"DFT axis {axis} must lie in [-{rank}, -2] or [0, {rank - 2}] for a "
                         f"rank-{rank} input (the last axis holds real and imaginary parts)")
    return axis % rank


def _dft_shape(specs, *, inverse=0, onesided=0):
    x = specs[0]
    dt = same_dtype(specs[:1], FLOATING)
    rank = len(x.shape)
    if rank < 2 or x.shape[-1] not in (1, 2):
        raise ShapeError(f"DFT needs an input [..., 1] (real) or [..., 2] (complex), got "
                         f"{x}")
    length = _scalar(specs[1] if len(specs) > 1 else None, "DFT dft_length")
    axis = _scalar(specs[2] if len(specs) > 2 else None, "DFT axis")
    a = _dft_axis(-2 if axis is None else int(axis), rank)
    n = x.shape[a]
    if length is None:
        length = mul(add(n, -1), 2) if inverse and onesided else n
    elif isinstance(length, int) and length < 1:
        raise ShapeError(f"DFT dft_length must be positive, got {length}")
    out = list(x.shape)
    if inverse and onesided:  # IRFFT: one-sided spectrum in, real signal out
        out[a], out[-1] = length, 1
    else:
        out[a] = add(floordiv(length, 2), 1) if onesided else length
        out[-1] = 2
    return TensorSpec(tuple(out), dt)


def _as_complex(x: np.ndarray) -> np.ndarray:
    """[..., 1] real or [..., 2] (real, imaginary) -> complex [...]."""
    if x.shape[-1] == 1:
        return x[..., 0]
    return x[..., 0] + 1j * x[..., 1]


def _as_pairs(z: np.ndarray, dtype) -> np.ndarray:
    out = np.empty(z.shape + (2,), dtype)
    out[..., 0] = z.real
    out[..., 1] = z.imag
    return out


@onnx_adapter("DFT", before=20)
def _dft_axis_attribute(node: ImportNode) -> None:
    """Opsets 17-19: ``axis`` was an attribute defaulting to 1; opset 20 made it an input
    defaulting to -2."""
    axis = node.attrs.pop("axis", 1)
    node.need(1)
    inputs = list(node.inputs) + [""] * max(0, 2 - len(node.inputs))
    node.inputs = inputs[:2] + [node.const(int(axis))]


@defop("DFT", shape=_dft_shape, static=("dft_length", "axis"), onnx_opset=20)
def dft(input, dft_length=None, axis=None, *, inverse=0, onesided=0):
    """ONNX DFT (opset 20): the discrete Fourier transform along ``axis`` (default -2).
    ``onesided`` keeps the non-redundant half (RFFT), or with ``inverse`` takes one and gives
    a real signal (IRFFT); the signal is cut or zero-padded to ``dft_length``."""
    rank = input.ndim
    a = _dft_axis(-2 if axis is None else int(np.asarray(axis).reshape(-1)[0]), rank)
    if input.shape[-1] not in (1, 2):
        raise ShapeError(f"DFT needs a last axis of 1 (real) or 2 (complex), got "
                         f"{input.shape[-1]}")
    n = None if dft_length is None else int(np.asarray(dft_length).reshape(-1)[0])
    if n is None:
        n = 2 * (input.shape[a] - 1) if inverse and onesided else input.shape[a]
    if n < 1:
        raise ShapeError(f"DFT dft_length must be positive, got {n}")
    z = _as_complex(input)
    if inverse and onesided:
        return np.fft.irfft(z, n=n, axis=a)[..., None].astype(input.dtype, copy=False)
    if inverse:
        return _as_pairs(np.fft.ifft(z, n=n, axis=a), input.dtype)
    y = np.fft.fft(z, n=n, axis=a)
    if onesided:
        y = np.take(y, np.arange(n // 2 + 1), axis=a)
    return _as_pairs(y, input.dtype)


# STFT ------------------------------------------------------------------------------------------

def _stft_geometry(signal_len, frame_step, window_len, frame_length):
    if frame_length is None:
        frame_length = window_len if window_len is not None else signal_len
    elif window_len is not None and isinstance(window_len, int) and window_len != frame_length:
        raise ShapeError(f"STFT window has length {window_len} but frame_length is "
                         f"{frame_length}; they must match")
    if isinstance(frame_step, int) and frame_step < 1:
        raise ShapeError(f"STFT frame_step must be positive, got {frame_step}")
    return frame_length


def _stft_shape(specs, *, onesided=1):
    x = specs[0]
    dt = same_dtype(specs[:1], FLOATING)
    if len(x.shape) != 3 or x.shape[-1] not in (1, 2):
        raise ShapeError(f"STFT needs a signal [batch, length, 1 or 2], got {x}")
    step = _scalar(specs[1], "STFT frame_step")
    window = specs[2] if len(specs) > 2 else None
    if window is not None and len(window.shape) != 1:
        raise ShapeError(f"STFT window must be 1-D, got {window}")
    length = _scalar(specs[3] if len(specs) > 3 else None, "STFT frame_length")
    fl = _stft_geometry(x.shape[1], step, None if window is None else window.shape[0], length)
    frames = add(floordiv(add(x.shape[1], mul(fl, -1)), step), 1)
    if isinstance(frames, int) and frames < 1:
        raise ShapeError(f"STFT frames of {fl} do not fit a signal of {x.shape[1]}")
    bins = add(floordiv(fl, 2), 1) if onesided else fl
    return TensorSpec((x.shape[0], frames, bins, 2), dt)


@defop("STFT", shape=_stft_shape, static=("frame_step", "frame_length"))
def stft(signal, frame_step, window=None, frame_length=None, *, onesided=1):
    """ONNX STFT: the DFT of each frame of ``frame_length`` samples, ``frame_step`` apart,
    multiplied by ``window`` (rectangular when omitted); frames = (length - frame_length) //
    frame_step + 1, no padding."""
    step = int(np.asarray(frame_step).reshape(-1)[0])
    fl = None if frame_length is None else int(np.asarray(frame_length).reshape(-1)[0])
    fl = _stft_geometry(signal.shape[1], step, None if window is None else window.shape[0], fl)
    if signal.shape[-1] not in (1, 2) or signal.ndim != 3:
        raise ShapeError(f"STFT needs a signal [batch, length, 1 or 2], got {list(signal.shape)}")
    if fl > signal.shape[1] or fl < 1:
        raise ShapeError(f"STFT frame_length {fl} must lie in [1, {signal.shape[1]}]")
    z = _as_complex(signal)  # (batch, length)
    frames = sliding_window_view(z, fl, axis=1)[:, ::step]  # (batch, frames, fl)
    if window is not None:
        frames = frames * window
    y = np.fft.fft(frames, axis=-1)
    if onesided:
        y = y[..., : fl // 2 + 1]
    return _as_pairs(y, signal.dtype)


# windows ---------------------------------------------------------------------------------------

def _window_shape(specs, *, output_datatype=DType.F32, periodic=1):
    size = _scalar(specs[0], "the window size")
    if isinstance(size, int) and size < 0:
        raise ShapeError(f"a window size must be non-negative, got {size}")
    return TensorSpec((size,), DType.of(output_datatype))


def _output_datatype(node: ImportNode) -> None:
    """``output_datatype`` is an ONNX element-type number in a file, a DType in the op set."""
    if "output_datatype" in node.attrs:
        node.attrs["output_datatype"] = node.dtype(node.attrs["output_datatype"])


onnx_adapter("HannWindow", "HammingWindow", "BlackmanWindow", "MelWeightMatrix")(
    _output_datatype)


def _cosine_window(size, periodic, output_datatype, coeffs):
    """sum_k (-1)^k coeffs[k] cos(2 pi k n / N), N = size (periodic) or size - 1."""
    n = int(np.asarray(size).reshape(-1)[0])
    if n < 0:
        raise ShapeError(f"a window size must be non-negative, got {n}")
    denom = n if periodic else n - 1
    phase = 2 * np.pi * np.arange(n) / (denom if denom else 1)
    out = np.zeros(n)
    for k, c in enumerate(coeffs):
        out += (-1) ** k * c * np.cos(k * phase)
    return out.astype(DType.of(output_datatype).numpy)


@defop("HannWindow", shape=_window_shape, static=("size",))
def hann_window(size, *, output_datatype=DType.F32, periodic=1):
    """ONNX HannWindow: 0.5 - 0.5 cos(2 pi n / N), N = size (periodic) or size - 1."""
    return _cosine_window(size, periodic, output_datatype, (0.5, 0.5))


@defop("HammingWindow", shape=_window_shape, static=("size",))
def hamming_window(size, *, output_datatype=DType.F32, periodic=1):
    """ONNX HammingWindow: 25/46 - 21/46 cos(2 pi n / N)."""
    return _cosine_window(size, periodic, output_datatype, (25 / 46, 21 / 46))


@defop("BlackmanWindow", shape=_window_shape, static=("size",))
def blackman_window(size, *, output_datatype=DType.F32, periodic=1):
    """ONNX BlackmanWindow: 0.42 - 0.5 cos(2 pi n / N) + 0.08 cos(4 pi n / N)."""
    return _cosine_window(size, periodic, output_datatype, (0.42, 0.5, 0.08))


# MelWeightMatrix -------------------------------------------------------------------------------

def _mel_shape(specs, *, output_datatype=DType.F32):
    bins = _scalar(specs[0], "MelWeightMatrix num_mel_bins")
    length = _scalar(specs[1], "MelWeightMatrix dft_length")
    for s, what in ((specs[2], "sample_rate"), (specs[3], "lower_edge_hertz"),
                    (specs[4], "upper_edge_hertz")):
        if len(s.shape) > 1:
            raise ShapeError(f"MelWeightMatrix {what} must be a scalar, got {s}")
    return TensorSpec((add(floordiv(length, 2), 1), bins), DType.of(output_datatype))


def _hz_to_mel(f):
    return 2595 * np.log10(1 + f / 700)


@defop("MelWeightMatrix", shape=_mel_shape, static=("num_mel_bins", "dft_length"))
def mel_weight_matrix(num_mel_bins, dft_length, sample_rate, lower_edge_hertz,
                      upper_edge_hertz, *, output_datatype=DType.F32):
    """ONNX MelWeightMatrix: [dft_length // 2 + 1, num_mel_bins] triangular filters of peak 1,
    their edges num_mel_bins + 2 points evenly spaced on the mel scale
    (mel(f) = 2595 log10(1 + f / 700)) between the two edge frequencies, each rounded down to
    a DFT bin as ONNX's reference does."""
    bins = int(np.asarray(num_mel_bins).reshape(-1)[0])
    length = int(np.asarray(dft_length).reshape(-1)[0])
    rate = float(np.asarray(sample_rate).reshape(-1)[0])
    lo = float(np.asarray(lower_edge_hertz).reshape(-1)[0])
    hi = float(np.asarray(upper_edge_hertz).reshape(-1)[0])
    if bins < 1 or length < 1 or rate <= 0 or not 0 <= lo < hi:
        raise ShapeError(f"MelWeightMatrix needs num_mel_bins, dft_length, sample_rate > 0 and "
                         f"0 <= lower_edge_hertz < upper_edge_hertz, got {bins}, {length}, "
                         f"{rate}, {lo}, {hi}")
    low_mel, high_mel = _hz_to_mel(lo), _hz_to_mel(hi)
    points = np.arange(bins + 2) * ((high_mel - low_mel) / (bins + 2)) + low_mel
    hz = 700 * np.expm1(points / 2595 * np.log(10))
    edge = (((length + 1) * hz) // rate).astype(np.int64)
    left, center, right = edge[:-2], edge[1:-1], edge[2:]
    j = np.arange(length // 2 + 1)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        rise = np.where(center > left, (j - left) / np.maximum(center - left, 1), 1.0)
        fall = (right - j) / np.maximum(right - center, 1)
    out = np.where((j >= left) & (j <= center), rise, np.where((j > center) & (j < right),
                                                                fall, 0.0))
    return out.astype(DType.of(output_datatype).numpy)
