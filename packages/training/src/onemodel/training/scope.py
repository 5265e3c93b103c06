"""``ActivationScope``: release a training step's activations when the step ends."""

from __future__ import annotations

from onemodel.tensors.scope import TensorScope


class ActivationScope(TensorScope):
    """``with ActivationScope():`` frees the autograd graph and the intermediate tensors created
    inside the block when it ends. Parameters, their gradients, optimizer state and tensors you
    ``keep()`` survive; using a released tensor raises ``ReleasedTensorError``.

    Read what you need inside the block (``loss.item()``) or keep it::

        with ActivationScope() as scope:
            loss = losses.mse(model(x), y)
            loss.backward()
            optimizer.step()
            scope.keep(loss)
    """
