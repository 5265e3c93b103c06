"""onemodel.training: modules, layers, losses, optimizers and checkpoints."""

from . import init, losses
from .checkpoint import Checkpoint, CheckpointError
from .data import DataLoader
from .layers import *  # noqa: F403 - the layers are this package's public names
from .layers import __all__ as _layers
from .loss_modules import (
    BCEWithLogitsLoss,
    CrossEntropyLoss,
    CTCLoss,
    KLDivLoss,
    L1Loss,
    MSELoss,
    NLLLoss,
    SmoothL1Loss,
)
from .module import Module, Parameter, StateDictError
from .optim import (
    SGD,
    Adagrad,
    Adam,
    AdamW,
    CosineAnnealingLR,
    ExponentialLR,
    LambdaLR,
    LinearLR,
    LRScheduler,
    MultiStepLR,
    NAdam,
    OneCycleLR,
    Optimizer,
    RAdam,
    ReduceLROnPlateau,
    RMSprop,
    SequentialLR,
    StepLR,
    clip_grad_norm_,
    clip_grad_value_,
)
from .scope import ActivationScope

__version__ = "0.1.0"

__all__ = [*_layers, "SGD", "ActivationScope", "Adam", "AdamW", "BCEWithLogitsLoss", "Checkpoint",
           "CheckpointError", "CrossEntropyLoss", "L1Loss", "MSELoss", "NLLLoss", "SmoothL1Loss",
           "CosineAnnealingLR", "DataLoader", "LRScheduler", "LambdaLR", "Module", "Optimizer",
           "Parameter", "RMSprop", "StateDictError", "StepLR", "clip_grad_norm_", "init",
           "losses", "Adagrad", "ExponentialLR", "LinearLR", "MultiStepLR", "NAdam", "OneCycleLR",
           "RAdam", "ReduceLROnPlateau", "SequentialLR", "clip_grad_value_", "CTCLoss", "KLDivLoss"]
