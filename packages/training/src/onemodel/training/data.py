"""Batching arrays, with shuffling from a ``Generator``: what PyTorch users reach for as
``TensorDataset`` plus ``DataLoader``."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from onemodel.tensors import Generator, OneModelError, Tensor


class DataLoader:
    """Iterate over mini-batches of equally long arrays or Tensors.

    ``DataLoader(x, y, batch_size=32, shuffle=True, generator=Generator(0))`` yields
    ``(x_batch, y_batch)`` tuples of Tensors; each pass reshuffles from the generator. A
    ``sampler`` (any sized iterable of row indices, such as a distributed sampler giving one
    rank its share) sets the rows and their order instead."""

    def __init__(self, *arrays, batch_size: int = 1, shuffle: bool = False,
                 generator: Generator | None = None, drop_last: bool = False, sampler=None):
        if not arrays:
            raise OneModelError("DataLoader needs at least one array")
        self.arrays = [a.numpy() if isinstance(a, Tensor) else np.asarray(a) for a in arrays]
        n = len(self.arrays[0])
        if any(len(a) != n for a in self.arrays):
            raise OneModelError("DataLoader arrays must have the same length, got "
                                + ", ".join(str(len(a)) for a in self.arrays))
        if batch_size < 1:
            raise OneModelError(f"batch_size must be at least 1, got {batch_size}")
        self.batch_size, self.shuffle, self.drop_last = batch_size, shuffle, drop_last
        self.generator = generator or Generator()
        if sampler is not None and shuffle:
            raise OneModelError("DataLoader: pass shuffle=True or a sampler, not both (the "
                                "sampler decides the order)")
        self.sampler = sampler

    def __len__(self) -> int:
        n = len(self.arrays[0]) if self.sampler is None else len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self) -> Iterator[tuple[Tensor, ...]]:
        if self.sampler is not None:
            order = np.fromiter(self.sampler, dtype=np.int64)
        else:
            n = len(self.arrays[0])
            order = self.generator.permutation(n) if self.shuffle else np.arange(n)
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            if self.drop_last and len(idx) < self.batch_size:
                break
            yield tuple(Tensor.from_numpy(np.ascontiguousarray(a[idx])) for a in self.arrays)
