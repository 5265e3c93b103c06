"""Attention and its relatives: scaled dot-product attention, rotary embeddings."""

from __future__ import annotations
