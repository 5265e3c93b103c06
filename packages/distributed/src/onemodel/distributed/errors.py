"""The errors of onemodel.distributed: all are OneModelErrors, so one ``except`` catches them."""

from __future__ import annotations

from onemodel.tensors import OneModelError


class DistributedError(OneModelError):
    """Distributed training or inference was misconfigured or the ranks disagree."""


class CollectiveTimeoutError(DistributedError):
    """A collective operation waited past its deadline: another rank died or hangs."""
