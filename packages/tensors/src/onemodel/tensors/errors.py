"""The error hierarchy: every error OneModel raises derives from :class:`OneModelError`."""

from __future__ import annotations


class OneModelError(Exception):
    """Base class of every error raised by OneModel packages."""


class ShapeError(OneModelError, ValueError):
    """Inputs of an op have shapes the op does not accept."""


class DTypeError(OneModelError, TypeError):
    """Inputs of an op have dtypes the op does not accept."""


class PluginError(OneModelError):
    """A plugin is missing, broken or registered twice."""


class AutogradError(OneModelError, RuntimeError):
    """Gradients cannot be computed as asked (no graph, non-scalar output, in-place change)."""


class ReleasedTensorError(OneModelError, RuntimeError):
    """A tensor was used after the ActivationScope that created it ended."""
