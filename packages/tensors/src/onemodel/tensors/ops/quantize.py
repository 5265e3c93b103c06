"""Quantization ops: linear quantize/dequantize, integer and QLinear products."""

from __future__ import annotations
