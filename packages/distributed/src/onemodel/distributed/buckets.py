"""Gradient buckets: parameters grouped into flat contiguous buffers, one allreduce per bucket.

One collective per parameter costs a latency per tensor; one for the whole model cannot start
before backward ends. Buckets of about ``cap`` bytes, filled in the order backward produces
gradients (last layer first), let each allreduce start while earlier layers still run backward.
"""

from __future__ import annotations

import numpy as np

from onemodel.tensors import Tensor


class Bucket:
    """Some parameters of one dtype and the flat buffer their gradients are reduced in."""

    __slots__ = ("buffer", "filled", "params", "request", "slices", "waiting")

    def __init__(self, params: list):
        self.params = params
        self.slices: list[slice] = []
        offset = 0
        for p in params:
            self.slices.append(slice(offset, offset + p.numel()))
            offset += p.numel()
        self.buffer = np.zeros(offset, params[0]._data.dtype)
        self.reset()

    def reset(self) -> None:
        self.filled = [False] * len(self.params)
        self.waiting = len(self.params)
        self.request = None

    def put(self, i: int) -> None:
        """Copy parameter ``i``'s gradient in (zeros when it has none: it was not used)."""
        if self.filled[i]:
            return
        g = self.params[i].grad
        if g is None:
            self.buffer[self.slices[i]] = 0
        else:
            self.buffer[self.slices[i]] = g._data.reshape(-1)
        self.filled[i] = True
        self.waiting -= 1

    def fill_rest(self) -> None:
        for i in range(len(self.params)):
            self.put(i)

    def write_back(self, scale: float) -> None:
        """Give each parameter the reduced gradient times ``scale`` (a new array: the buffer
        is reused by the next step)."""
        for p, sl in zip(self.params, self.slices):
            p.grad = Tensor._wrap((self.buffer[sl] * self.buffer.dtype.type(scale))
                                  .reshape(p._data.shape))

    @property
    def nbytes(self) -> int:
        return self.buffer.nbytes


def make_buckets(params: list, cap_bytes: int) -> list[Bucket]:
    """Buckets of at most ``cap_bytes`` (a larger parameter gets one of its own), in reverse
    registration order, one dtype per bucket."""
    open_: dict = {}
    sizes: dict = {}
    done: list[list] = []
    for p in reversed(params):
        dt = p._data.dtype
        current = open_.setdefault(dt, [])
        if current and sizes[dt] + p._data.nbytes > cap_bytes:
            done.append(current)
            current = open_[dt] = []
            sizes[dt] = 0
        current.append(p)
        sizes[dt] = sizes.get(dt, 0) + p._data.nbytes
    done.extend(group for group in open_.values() if group)
    return [Bucket(group) for group in done]
