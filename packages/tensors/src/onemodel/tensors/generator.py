"""Deterministic random streams for initialization, dropout and data shuffling."""

from __future__ import annotations

import numpy as np

from .dtype import DType


class Generator:
    """A seeded random stream: the same seed gives the same numbers on every machine.

    ``Generator(42)``; ``Generator()`` draws a fresh seed from the operating system.
    """

    def __init__(self, seed: int | None = None):
        if seed is None:
            seed = int(np.random.SeedSequence().entropy % (2**63))
        self.seed = int(seed)
        self._rng = np.random.Generator(np.random.PCG64(self.seed))

    def uniform(self, shape, low: float = 0.0, high: float = 1.0, dtype=DType.F32) -> np.ndarray:
        return self._rng.uniform(low, high, size=tuple(shape)).astype(DType.of(dtype).numpy)

    def normal(self, shape, mean: float = 0.0, std: float = 1.0, dtype=DType.F32) -> np.ndarray:
        return self._rng.normal(mean, std, size=tuple(shape)).astype(DType.of(dtype).numpy)

    def bernoulli(self, shape, p: float) -> np.ndarray:
        """Boolean mask whose entries are True with probability ``p``."""
        return self._rng.random(size=tuple(shape)) < p

    def integers(self, low: int, high: int, shape=(), dtype=DType.I64) -> np.ndarray:
        return self._rng.integers(low, high, size=tuple(shape)).astype(DType.of(dtype).numpy)

    def permutation(self, n: int) -> np.ndarray:
        return self._rng.permutation(n)

    def get_state(self) -> dict:
        """A JSON-serializable state; :meth:`set_state` restores the stream exactly."""
        return self._rng.bit_generator.state

    def set_state(self, state: dict) -> None:
        self._rng.bit_generator.state = state

    def __repr__(self) -> str:
        return f"Generator(seed={self.seed})"


_default: Generator | None = None


def default_generator() -> Generator:
    """The stream used when no generator is given (seeded from the operating system)."""
    global _default
    if _default is None:  # made on first use: numpy.random costs tens of ms to import
        _default = Generator()
    return _default
