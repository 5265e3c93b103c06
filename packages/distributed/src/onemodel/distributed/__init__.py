"""onemodel.distributed: data-parallel training over MPI and batch inference over Ray.

Neither engine is imported here: ``mpi4py`` when a communicator is first made, ``ray`` by
``onemodel.distributed.ray``. Install them with the extras ``[mpi]`` and ``[ray]``.
"""

from __future__ import annotations

from .errors import CollectiveTimeoutError, DistributedError
from .sampler import DistributedSampler

__version__ = "0.1.0"

_LAZY = {
    "Communicator": ".comm",
    "DistributedDataParallel": ".ddp",
    "SyncBatchNorm": ".syncbn",
    "convert_sync_batchnorm": ".syncbn",
}


def __getattr__(name: str):
    # The training side imports onemodel.training; inference over Ray needs only the runtime.
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'onemodel.distributed' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module, __name__), name)


__all__ = ["CollectiveTimeoutError", "Communicator", "DistributedDataParallel", "DistributedError",
           "DistributedSampler", "SyncBatchNorm", "convert_sync_batchnorm"]
