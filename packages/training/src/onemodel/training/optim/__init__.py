"""Optimizers, learning-rate schedulers and gradient clipping."""

from .adagrad import Adagrad, NAdam, RAdam
from .adam import Adam, AdamW
from .clip import clip_grad_norm_, clip_grad_value_
from .lr_scheduler import (
    CosineAnnealingLR,
    ExponentialLR,
    LambdaLR,
    LinearLR,
    LRScheduler,
    MultiStepLR,
    OneCycleLR,
    ReduceLROnPlateau,
    SequentialLR,
    StepLR,
)
from .optimizer import Optimizer
from .rmsprop import RMSprop
from .sgd import SGD

__all__ = ["SGD", "Adagrad", "Adam", "AdamW", "CosineAnnealingLR", "ExponentialLR", "LRScheduler",
           "LambdaLR", "LinearLR", "MultiStepLR", "NAdam", "OneCycleLR", "Optimizer", "RAdam",
           "RMSprop", "ReduceLROnPlateau", "SequentialLR", "StepLR", "clip_grad_norm_",
           "clip_grad_value_"]
