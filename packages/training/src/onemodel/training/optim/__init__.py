"""Optimizers, learning-rate schedulers and gradient clipping."""

from .adam import Adam, AdamW
from .clip import clip_grad_norm_
from .lr_scheduler import CosineAnnealingLR, LambdaLR, LRScheduler, StepLR
from .optimizer import Optimizer
from .rmsprop import RMSprop
from .sgd import SGD

__all__ = ["SGD", "Adam", "AdamW", "CosineAnnealingLR", "LRScheduler", "LambdaLR", "Optimizer",
           "RMSprop", "StepLR", "clip_grad_norm_"]
