"""Loss modules with torch.nn's names and constructor arguments, over the functions in
:mod:`onemodel.training.losses` (the arguments are stored, ``forward(input, target)`` calls the
function). Losses belong to training, so like the functions they refuse to be traced."""

from __future__ import annotations

from onemodel.tensors import OneModelError, Tensor

from . import losses
from .module import Module

_REDUCTIONS = ("mean", "sum", "none")


class _Loss(Module):
    def __init__(self, reduction: str = "mean"):
        super().__init__()
        if reduction not in _REDUCTIONS:
            raise OneModelError(f"reduction must be 'mean', 'sum' or 'none', not {reduction!r}")
        self.reduction = reduction

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}"


class MSELoss(_Loss):
    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return losses.mse(input, target, self.reduction)


class L1Loss(_Loss):
    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return losses.l1(input, target, self.reduction)


class SmoothL1Loss(_Loss):
    def __init__(self, reduction: str = "mean", beta: float = 1.0):
        super().__init__(reduction)
        self.beta = beta

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return losses.smooth_l1(input, target, self.reduction, self.beta)


class NLLLoss(_Loss):
    def __init__(self, weight: Tensor | None = None, ignore_index: int = -100,
                 reduction: str = "mean"):
        super().__init__(reduction)
        self.ignore_index = ignore_index
        self.register_buffer("weight", weight)

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return losses.nll(input, target, self.weight, self.ignore_index, self.reduction)


class CrossEntropyLoss(_Loss):
    """Logits (classes on axis 1) against class indices or class probabilities."""

    def __init__(self, weight: Tensor | None = None, ignore_index: int = -100,
                 reduction: str = "mean", label_smoothing: float = 0.0):
        super().__init__(reduction)
        self.ignore_index, self.label_smoothing = ignore_index, label_smoothing
        self.register_buffer("weight", weight)

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return losses.cross_entropy(input, target, self.weight, self.ignore_index,
                                    self.reduction, self.label_smoothing)


class BCEWithLogitsLoss(_Loss):
    def __init__(self, weight: Tensor | None = None, reduction: str = "mean",
                 pos_weight: Tensor | None = None):
        super().__init__(reduction)
        self.register_buffer("weight", weight)
        self.register_buffer("pos_weight", pos_weight)

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return losses.binary_cross_entropy_with_logits(input, target, self.weight,
                                                       self.reduction, self.pos_weight)


class KLDivLoss(Module):
    """``input`` log-probabilities against ``target`` probabilities (or log-probabilities with
    ``log_target``); use ``reduction='batchmean'`` for the KL divergence itself."""

    def __init__(self, reduction: str = "mean", log_target: bool = False):
        super().__init__()
        if reduction not in (*_REDUCTIONS, "batchmean"):
            raise OneModelError(f"reduction must be 'mean', 'batchmean', 'sum' or 'none', not "
                                f"{reduction!r}")
        self.reduction, self.log_target = reduction, log_target

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return losses.kl_div(input, target, self.reduction, self.log_target)

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}, log_target={self.log_target}"


class CTCLoss(_Loss):
    """Connectionist temporal classification: ``forward(log_probs (T, N, C), targets,
    input_lengths, target_lengths)``; 'mean' divides each loss by its target length."""

    def __init__(self, blank: int = 0, reduction: str = "mean", zero_infinity: bool = False):
        super().__init__(reduction)
        self.blank, self.zero_infinity = blank, zero_infinity

    def forward(self, log_probs: Tensor, targets: Tensor, input_lengths, target_lengths) -> Tensor:
        return losses.ctc(log_probs, targets, input_lengths, target_lengths, self.blank,
                          self.reduction, self.zero_infinity)


__all__ = ["BCEWithLogitsLoss", "CTCLoss", "CrossEntropyLoss", "KLDivLoss", "L1Loss", "MSELoss",
           "NLLLoss", "SmoothL1Loss"]
