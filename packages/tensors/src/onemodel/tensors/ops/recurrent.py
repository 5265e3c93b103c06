"""Recurrent ops with ONNX semantics and gate orders: RNN, GRU, LSTM."""

from __future__ import annotations
