"""``SyncBatchNorm``: BatchNorm whose training statistics cover the whole global batch.

Each rank sees a slice of the batch; plain BatchNorm would normalize each slice by its own mean
and variance, so two ranks would not train as one process with the full batch. Here the per-rank
sums are added over ranks by a differentiable allreduce (whose gradient is again an allreduce),
with the same two-pass formula as ``batch_norm``: the mean first, then the centred squares.
In eval mode (and when tracing) it is plain BatchNorm, so checkpoints and traced graphs are the
same as the unsynchronized layer's.
"""

from __future__ import annotations

import numpy as np

from onemodel.tensors import OneModelError, Tensor, concat
from onemodel.tensors import autograd as _autograd
from onemodel.tensors.dispatch import _record
from onemodel.tensors.ops.base import OpDef, TensorSpec
from onemodel.training import BatchNorm1d, BatchNorm2d, Module
from onemodel.training.layers.normalization import _BatchNorm

from .comm import Communicator


def _allreduce_kernel(x: np.ndarray, *, comm: Communicator | None = None) -> np.ndarray:
    """Sum over the ranks of ``comm``."""
    return comm.allreduce_(np.array(x, copy=True, order="C"), "SyncBatchNorm statistics")


def _allreduce_shape(specs: list[TensorSpec], **_attrs) -> TensorSpec:
    return specs[0]


def _allreduce_grad(node, gy: Tensor):
    # every rank's output is the same sum, so each input's gradient sums every rank's gradient
    comm = node.attrs["comm"]
    return Tensor._wrap(comm.allreduce_(np.array(gy._data, copy=True, order="C"),
                                        "SyncBatchNorm gradient"))


# A tape entry, not an op of the op set: it has no graph form and is never dispatched.
ALLREDUCE = OpDef(
    name="AllReduceSum", kernel=_allreduce_kernel, shape_rule=_allreduce_shape,
    grad=_allreduce_grad, inputs=("x",), optional=frozenset(), variadic=False,
    attrs={"comm": None}, outputs=("y",), domain="onemodel.distributed",
    doc="Sum over MPI ranks; its gradient is the sum of the ranks' gradients.",
)


def all_reduce_sum(x: Tensor, comm: Communicator) -> Tensor:
    """The sum of ``x`` over every rank, recorded on the tape so backward reduces too."""
    out = Tensor._wrap(_allreduce_kernel(x._data, comm=comm))
    if x.requires_grad and _autograd.is_grad_enabled():
        _record(ALLREDUCE, (x,), {"comm": comm}, out)
    return out


_default_comm: Communicator | None = None


def _world() -> Communicator:
    global _default_comm
    if _default_comm is None:
        _default_comm = Communicator().dup()
    return _default_comm


class SyncBatchNorm(_BatchNorm):
    """BatchNorm over inputs of rank 2 to 4 whose training statistics are reduced over ranks.

    ``comm`` defaults to a duplicate of the MPI world (made on first use), so its collectives
    never interleave with the gradient buckets'."""

    _ranks = (2, 3, 4)

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1,
                 affine: bool = True, track_running_stats: bool = True, comm=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.comm = comm

    def forward(self, x: Tensor) -> Tensor:
        if not self.training:
            return super().forward(x)
        if self.comm is None:
            self.comm = _world()
        comm = self.comm if isinstance(self.comm, Communicator) else Communicator.wrap(self.comm)
        if comm.size == 1:
            return super().forward(x)
        if x.ndim not in self._ranks:
            raise OneModelError(f"SyncBatchNorm expects input of rank 2, 3 or 4, got shape "
                                f"{list(x.shape)}")
        c = x.shape[1]
        if c != self.num_features:
            raise OneModelError(f"SyncBatchNorm({self.num_features}) got {c} channels (input "
                                f"shape {list(x.shape)})")
        axes = (0, *range(2, x.ndim))
        shape = (1, c) + (1,) * (x.ndim - 2)
        count = Tensor._wrap(np.array([x.numel() // c], x._data.dtype))
        sums = all_reduce_sum(concat([x.sum(axis=axes), count], axis=0), comm)
        n = float(sums._data[c])
        if n < 2 and self.track_running_stats:
            raise OneModelError(f"SyncBatchNorm needs more than one value per channel over all "
                                f"ranks in training mode, got input shape {list(x.shape)}")
        mean = sums[:c] * (1.0 / n)
        xc = x - mean.reshape(*shape)
        var = all_reduce_sum((xc * xc).sum(axis=axes), comm) * (1.0 / n)
        y = xc * (var.reshape(*shape) + self.eps) ** -0.5
        if self.weight is not None:
            y = y * self.weight.reshape(*shape) + self.bias.reshape(*shape)
        if self.track_running_stats:
            self.num_batches_tracked._data += 1
            m = x._data.dtype.type(self.momentum)
            self.running_mean._data *= 1 - m
            self.running_mean._data += m * mean._data
            self.running_var._data *= 1 - m
            self.running_var._data += m * var._data * (n / (n - 1))
        return y


def convert_sync_batchnorm(module: Module, comm=None) -> Module:
    """Replace every BatchNorm1d/2d inside ``module`` by a SyncBatchNorm with the same
    parameters and running statistics; returns ``module`` (or the new layer if it is one)."""
    if comm is None:
        comm = _world()
    elif not isinstance(comm, Communicator):
        comm = Communicator.wrap(comm).dup()
    if isinstance(module, (BatchNorm1d, BatchNorm2d)):
        return _converted(module, comm)
    for parent in list(module.modules()):
        for name, child in list(parent._modules.items()):
            if isinstance(child, (BatchNorm1d, BatchNorm2d)):
                parent._modules[name] = _converted(child, comm)
    return module


def _converted(bn: _BatchNorm, comm: Communicator) -> SyncBatchNorm:
    new = SyncBatchNorm(bn.num_features, bn.eps, bn.momentum, bn.affine,
                        bn.track_running_stats, comm=comm)
    for table in ("_parameters", "_buffers"):
        getattr(new, table).update(getattr(bn, table))  # the same tensors: optimizers still see them
    new.training = bn.training
    return new
