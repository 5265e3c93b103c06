"""Signal-processing ops: DFT, STFT, window functions, mel weight matrices."""

from __future__ import annotations
