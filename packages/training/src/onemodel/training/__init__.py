"""onemodel.training: modules, layers, losses, optimizers and checkpoints."""

__version__ = "0.1.0"
