"""``DistributedSampler``: each rank's share of a dataset's indices, reshuffled every epoch.

Every rank draws the same permutation from a shared seed and the epoch number, then takes every
``world_size``-th index starting at its rank. So batch ``b`` of all ranks together holds exactly
the rows of batch ``b`` of one process whose batch is ``world_size`` times larger.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from onemodel.tensors import Generator

from .errors import DistributedError


class DistributedSampler:
    """Indices of ``length`` rows for one rank: ``DataLoader(x, y, batch_size=32,
    sampler=DistributedSampler(len(x)))``.

    ``num_replicas`` and ``rank`` default to the MPI world (``comm``). When ``length`` does not
    divide evenly, ``drop_last`` drops the tail; otherwise the first indices are repeated so
    every rank gets as many (and so runs as many steps, as collectives require)."""

    def __init__(self, length: int, *, num_replicas: int | None = None, rank: int | None = None,
                 comm=None, shuffle: bool = True, seed: int = 0, drop_last: bool = False):
        if num_replicas is None or rank is None:
            from .comm import Communicator

            c = Communicator.wrap(comm)
            num_replicas = c.size if num_replicas is None else num_replicas
            rank = c.rank if rank is None else rank
        if length < 0:
            raise DistributedError(f"length must be at least 0, got {length}")
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise DistributedError(f"rank must be in [0, {num_replicas}), got {rank} "
                                   f"(num_replicas={num_replicas})")
        self.length, self.num_replicas, self.rank = int(length), int(num_replicas), int(rank)
        self.shuffle, self.seed, self.drop_last = shuffle, int(seed), drop_last
        self.epoch = 0
        if drop_last:
            self.num_samples = self.length // self.num_replicas
        else:
            self.num_samples = -(-self.length // self.num_replicas)

    def set_epoch(self, epoch: int) -> None:
        """Call at the start of each epoch, on every rank, for a new shared shuffle."""
        self.epoch = int(epoch)

    def indices(self) -> np.ndarray:
        """This rank's indices for the current epoch."""
        if self.shuffle:
            order = Generator(self.seed + self.epoch).permutation(self.length)
        else:
            order = np.arange(self.length)
        total = self.num_samples * self.num_replicas
        if total <= self.length:
            order = order[:total]
        elif self.length:
            order = np.resize(order, total)  # repeats from the start
        return np.asarray(order[self.rank : total : self.num_replicas], dtype=np.int64)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices().tolist())

    def __len__(self) -> int:
        return self.num_samples
