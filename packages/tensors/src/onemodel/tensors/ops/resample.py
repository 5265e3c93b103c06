"""Resampling ops: Resize, GridSample, AffineGrid, Col2Im, CenterCropPad."""

from __future__ import annotations
