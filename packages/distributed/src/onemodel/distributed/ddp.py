"""``DistributedDataParallel``: one model replica per MPI rank, gradients averaged after backward.

In the spirit of PyTorch DDP and Horovod: parameters and buffers are broadcast from rank 0 when
the model is wrapped; during ``loss.backward()`` the autograd tape reports each parameter whose
gradient is complete, its bucket's flat buffer is filled, and a full bucket's non-blocking
allreduce starts while the rest of backward runs. When backward returns, every ``.grad`` holds
the average over ranks, so an unchanged optimizer keeps the replicas identical.
"""

from __future__ import annotations

import contextlib
import os
import weakref
import zlib
from collections.abc import Iterator

import numpy as np

from onemodel.tensors import Tensor
from onemodel.tensors import autograd as _autograd
from onemodel.training import Checkpoint, Module
from onemodel.training.optim.optimizer import Optimizer

from .buckets import Bucket, make_buckets
from .comm import Communicator
from .errors import DistributedError


class DistributedDataParallel(Module):
    """Wrap ``model`` for data-parallel training over the ranks of ``comm`` (default: every
    rank started by ``mpirun``).

    :param bucket_cap_mb: the size of a gradient bucket; smaller buckets start reducing sooner,
        larger ones make fewer collectives.
    :param broadcast_buffers: copy rank 0's buffers (BatchNorm running statistics) to every rank
        at each training forward, so replicas agree without SyncBatchNorm.
    :param timeout: seconds any collective may wait before :class:`CollectiveTimeoutError`
        (default ``$ONEMODEL_DIST_TIMEOUT`` or 300).
    """

    def __init__(self, model: Module, comm=None, *, bucket_cap_mb: float = 1.0,
                 broadcast_buffers: bool = True, timeout: float | None = None):
        super().__init__()
        if not isinstance(model, Module):
            raise DistributedError(f"DistributedDataParallel wraps a Module, not "
                                   f"{type(model).__name__}")
        if bucket_cap_mb <= 0:
            raise DistributedError(f"bucket_cap_mb must be positive, got {bucket_cap_mb}")
        self.module = model
        self.comm = Communicator.wrap(comm, timeout=timeout)
        self.broadcast_buffers = broadcast_buffers
        self._check_same_model()
        self._broadcast_state(list(model.state_dict().values()), "parameter broadcast from rank 0")
        params = list({id(p): p for p in model.parameters() if p.requires_grad}.values())
        self.buckets: list[Bucket] = make_buckets(params, max(1, int(bucket_cap_mb * 2**20)))
        self._slots = {id(p): (b, i) for b in self.buckets for i, p in enumerate(b.params)}
        self._expect = False  # a forward with grad enabled happened: its backward must sync
        self._sync = True
        self._next = 0  # the next bucket to start, in order: every rank starts them alike
        if self.comm.size > 1:
            self._hook = _weak_hook(self)
            _autograd._grad_ready_hooks.append(self._hook)
            weakref.finalize(self, _remove_hook, self._hook)

    # the world ----------------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self.comm.rank

    @property
    def world_size(self) -> int:
        return self.comm.size

    # running ------------------------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        if self.comm.size > 1:
            if self.broadcast_buffers and self.training:
                buffers = [b for b in self.module.buffers() if b is not None]
                self._broadcast_state(buffers, "buffer broadcast from rank 0")
            if _autograd.is_grad_enabled() and self._sync:
                self._start_step()
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Inside, backward only accumulates local gradients (gradient accumulation); the first
        backward after the block averages what was accumulated."""
        before = self._sync
        self._sync = False
        try:
            yield
        finally:
            self._sync = before

    def average(self, value) -> np.ndarray | float:
        """The mean over ranks of a number, numpy array or Tensor (for logging a loss)."""
        if isinstance(value, Tensor):
            value = value.numpy()
        arr = np.array(value, dtype=np.float64, copy=True)
        self.comm.allreduce_(arr.reshape(-1), "average over ranks")
        arr /= self.comm.size
        return float(arr) if arr.ndim == 0 else arr

    # checkpoints --------------------------------------------------------------------------------
    def save_checkpoint(self, path: str | os.PathLike, optimizer: Optimizer | None = None) -> None:
        """Rank 0 writes the wrapped model's checkpoint (atomically: a temporary file, then a
        rename); every rank returns once it is written, or raises if rank 0 failed."""
        failure = None
        if self.comm.rank == 0:
            try:
                Checkpoint.save(path, self.module, optimizer)
            except Exception as exc:  # reported to every rank below, then re-raised here
                failure = exc
        status = np.array([0 if failure is None else 1], np.int32)
        self.comm.bcast_(status, what=f"checkpoint status of {os.fspath(path)!r}")
        if failure is not None:
            raise failure
        if status[0]:
            raise DistributedError(f"rank 0 could not write the checkpoint {os.fspath(path)!r}; "
                                   "its output says why")

    def load_checkpoint(self, path: str | os.PathLike, optimizer: Optimizer | None = None) -> dict:
        """Every rank loads ``path`` (a file all ranks can read), then rank 0's values are
        broadcast so the replicas agree exactly."""
        meta = Checkpoint.load(path, self.module, optimizer)
        self._broadcast_state(list(self.module.state_dict().values()),
                              "checkpoint broadcast from rank 0")
        return meta

    def close(self) -> None:
        """Stop reducing gradients (the wrapper is left for plain, local training)."""
        hook = self.__dict__.pop("_hook", None)
        if hook is not None:
            _remove_hook(hook)

    # gradient reduction -------------------------------------------------------------------------
    def _start_step(self) -> None:
        if self._next:  # a previous backward failed half-way: start clean
            for b in self.buckets:
                b.reset()
            self._next = 0
        self._expect = True

    def _on_grad_ready(self, leaf) -> None:
        if not self._expect:
            return
        if leaf is None:
            self._finish()
            return
        slot = self._slots.get(id(leaf))
        if slot is not None:
            bucket, i = slot
            bucket.put(i)
            if bucket.waiting == 0:
                self._start_ready()
            elif self._next:  # MPI moves started collectives along only when called
                self.buckets[self._next - 1].request.Test()

    def _start_ready(self) -> None:
        while self._next < len(self.buckets) and self.buckets[self._next].waiting == 0:
            b = self.buckets[self._next]
            b.request = self.comm.iallreduce(b.buffer)
            self._next += 1

    def _finish(self) -> None:
        self._expect = False
        for b in self.buckets:  # parameters backward did not reach contribute zeros
            b.fill_rest()
        self._start_ready()
        scale = 1.0 / self.comm.size
        for k, b in enumerate(self.buckets):
            self.comm.wait(b.request, f"gradient allreduce of bucket {k + 1} of "
                                      f"{len(self.buckets)} ({b.nbytes} bytes)")
        for b in self.buckets:
            b.write_back(scale)
            b.reset()
        self._next = 0

    # agreement between ranks --------------------------------------------------------------------
    def _check_same_model(self) -> None:
        described = ";".join(f"{k}:{v.dtype.name}{list(v.shape)}"
                             for k, v in self.module.state_dict().items())
        mine = np.array([zlib.crc32(described.encode())], np.int64)
        root = self.comm.bcast_(mine.copy(), what="model check")
        differs = np.array([int(root[0] != mine[0])], np.int64)
        self.comm.allreduce_(differs, "model check")
        if differs[0]:
            raise DistributedError(
                f"rank {self.comm.rank}: the ranks wrap different models ({int(differs[0])} of "
                f"{self.comm.size} differ from rank 0 in parameter names, shapes or dtypes); "
                "build the same model on every rank"
            )

    def _broadcast_state(self, tensors: list[Tensor], what: str) -> None:
        if self.comm.size == 1 or not tensors:
            return
        groups: dict = {}
        for t in tensors:
            groups.setdefault(t._data.dtype.str, []).append(t)
        for dtype in sorted(groups):  # the same order on every rank
            group = groups[dtype]
            flat = np.concatenate([t._data.reshape(-1) for t in group])
            self.comm.bcast_(flat, what=what)
            offset = 0
            for t in group:
                t._data[...] = flat[offset:offset + t._data.size].reshape(t._data.shape)
                offset += t._data.size


def _weak_hook(ddp: DistributedDataParallel):
    ref = weakref.ref(ddp)

    def hook(leaf) -> None:
        target = ref()
        if target is not None:
            target._on_grad_ready(leaf)

    return hook


def _remove_hook(hook) -> None:
    with contextlib.suppress(ValueError):
        _autograd._grad_ready_hooks.remove(hook)
