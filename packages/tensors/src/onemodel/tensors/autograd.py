"""Reverse-mode autograd: the tape node each differentiable op leaves, grad mode and backward.

Gradient rules live next to their ops (``ops/*.py``) and are written with other ops, so they run
through the same dispatch (and can themselves be differentiated with ``create_graph=True``).
"""

from __future__ import annotations

import functools
import threading
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import AutogradError

if TYPE_CHECKING:
    from .ops.base import OpDef


class _GradMode(threading.local):
    enabled = True


grad_mode = _GradMode()


def is_grad_enabled() -> bool:
    return grad_mode.enabled


class _SetGrad:
    """Context manager and decorator that sets grad mode and restores it afterwards."""

    def __init__(self, enabled: bool):
        self._enabled = enabled
        self._prev: list[bool] = []

    def __enter__(self):
        self._prev.append(grad_mode.enabled)
        grad_mode.enabled = self._enabled
        _on_enter(self._enabled)
        return self

    def __exit__(self, *exc):
        grad_mode.enabled = self._prev.pop()
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with type(self)():
                return fn(*args, **kwargs)

        return wrapper


class no_grad(_SetGrad):
    """``with no_grad():`` ops record no gradient tape inside the block."""

    def __init__(self):
        super().__init__(False)


class enable_grad(_SetGrad):
    """``with enable_grad():`` turn recording back on inside a ``no_grad`` block."""

    def __init__(self):
        super().__init__(True)


# Tracing refuses no_grad; it registers here instead of this module importing tracing.
_enter_hooks: list = []


def _on_enter(enabled: bool) -> None:
    for hook in _enter_hooks:
        hook(enabled)


# Data-parallel training reduces gradients while backward still runs. Each hook here is called
# with a leaf once no later node of this backward pass can add to its gradient, then with None
# when the pass ends. An empty list costs one check per backward() call.
_grad_ready_hooks: list = []


class Node:
    """One recorded op application: what its gradient rule needs.

    ``inputs`` are the input Tensors and ``attrs`` the op's full attributes. ``outputs`` are the
    output Tensors while they are alive (so second derivatives flow through them), otherwise
    detached Tensors over the saved data: the node holds no strong reference to its outputs, and
    no reference cycle keeps activations alive.
    """

    __slots__ = ("_saved", "attrs", "inputs", "op")

    def __init__(self, op: OpDef, inputs: tuple, attrs: dict[str, Any], outputs: tuple):
        self.op = op
        self.inputs = inputs
        self.attrs = attrs
        self._saved = tuple((weakref.ref(o), o._data, o._device) for o in outputs)

    @property
    def outputs(self) -> tuple:
        out = []
        for ref, data, device in self._saved:
            t = ref()
            out.append(Tensor._wrap(data, device) if t is None else t)
        return tuple(out)

    def __repr__(self) -> str:
        return f"<Node {self.op.name}>"


def backward(root: Tensor, gradient=None, *, retain_graph: bool = False,
             create_graph: bool = False) -> None:
    """Accumulate d(root)/d(leaf) into ``.grad`` of every leaf that requires grad."""

    if not root.requires_grad:
        raise AutogradError(
            "backward() on a tensor that does not require grad: no input of the computation "
            "had requires_grad=True (or it ran under no_grad())"
        )
    if gradient is None:
        if root.numel() != 1:
            raise AutogradError(
                f"backward() without a gradient needs a one-element output, got shape "
                f"{list(root.shape)}; pass gradient=ones_like(output) or reduce it first"
            )
        gradient = _on_device_of(root, np.ones(root.shape, root._data.dtype))
    elif not isinstance(gradient, Tensor):
        gradient = _on_device_of(root, np.asarray(gradient, dtype=root._data.dtype))
    if tuple(gradient.shape) != tuple(root.shape):
        raise AutogradError(
            f"gradient shape {list(gradient.shape)} does not match output shape {list(root.shape)}"
        )
    if root._node is None:  # a leaf
        _accumulate(root, gradient, {id(gradient._data)})
        return

    retain_graph = retain_graph or create_graph  # as in PyTorch
    handed: set[int] = {id(gradient._data)}  # arrays a leaf's .grad may not own alone
    order = _topological(root._node)
    pending: dict[int, list] = {id(root._node): [None] * len(root._node._saved)}
    pending[id(root._node)][root._index] = gradient
    uses = _leaf_uses(order) if _grad_ready_hooks else None
    prev = grad_mode.enabled
    grad_mode.enabled = create_graph
    try:
        for node in order:
            gouts = pending.pop(id(node), None)
            ready = _release_leaves(node, uses) if uses is not None else None
            if gouts is None or all(g is None for g in gouts):
                if ready:
                    _fire_ready(ready)
                continue
            if node.inputs is None:
                raise AutogradError(
                    "backward() through a graph that was already freed: call "
                    "backward(retain_graph=True) the first time to go through it twice"
                )
            if len(gouts) > 1:
                gouts = [
                    _on_device_of(o, np.zeros(o.shape, o._data.dtype)) if g is None else g
                    for g, o in zip(gouts, node.outputs)
                ]
            gins = node.op.grad(node, *gouts)
            if not isinstance(gins, (tuple, list)):
                gins = (gins,)
            for inp, g in zip(node.inputs, gins):
                if g is None or inp is None or not inp.requires_grad:
                    continue
                if tuple(g.shape) != tuple(inp.shape):
                    raise AutogradError(
                        f"gradient rule of {node.op.name} gave shape {list(g.shape)} for an input "
                        f"of shape {list(inp.shape)}"
                    )
                if inp._node is None:
                    _accumulate(inp, g, handed)
                else:
                    slot = pending.setdefault(id(inp._node), [None] * len(inp._node._saved))
                    prev_g = slot[inp._index]
                    slot[inp._index] = g if prev_g is None else prev_g + g
            if not retain_graph:
                node.inputs = None
            if ready:
                _fire_ready(ready)
    finally:
        grad_mode.enabled = prev
    if uses is not None:
        for hook in _grad_ready_hooks:
            hook(None)


def _leaf_uses(order: list[Node]) -> dict[int, list]:
    """For each leaf that requires grad: [leaf, how many nodes of this pass may add to it]."""
    uses: dict[int, list] = {}
    for node in order:
        for inp in node.inputs or ():
            if inp is not None and inp._node is None and inp.requires_grad:
                uses.setdefault(id(inp), [inp, 0])[1] += 1
    return uses


def _release_leaves(node: Node, uses: dict[int, list]) -> list:
    """The leaves whose last contributing node is ``node`` (read before it drops its inputs)."""
    done = []
    for inp in node.inputs or ():
        entry = None if inp is None else uses.get(id(inp))
        if entry is not None:
            entry[1] -= 1
            if entry[1] == 0:
                done.append(entry[0])
    return done


def _fire_ready(leaves: list) -> None:
    for leaf in leaves:
        for hook in _grad_ready_hooks:
            hook(leaf)


def _accumulate(leaf: Tensor, g: Tensor, handed: set[int]) -> None:
    """Add ``g`` into ``leaf.grad``. Without ``create_graph`` the gradient is a buffer the leaf
    owns, made outside dispatch, so releasing activations never touches it. A gradient array is
    adopted without a copy when it is fresh: contiguous, owning its data and not handed to
    another leaf (or given by the caller) in this backward pass."""
    if not leaf.requires_grad:
        return

    if g._data.dtype != leaf._data.dtype:
        g = g.cast(leaf.dtype)
    if grad_mode.enabled:  # create_graph: keep the gradient's own graph
        leaf.grad = g if leaf.grad is None else leaf.grad + g
        return
    arr = g._data
    if leaf.grad is not None:
        leaf.grad = Tensor._wrap(leaf.grad._data + arr, leaf._device)
        return
    fresh = arr.flags.c_contiguous and arr.flags.owndata and id(arr) not in handed
    handed.add(id(arr))
    leaf.grad = Tensor._wrap(arr if fresh else arr.copy(order="C"), leaf._device)


def _on_device_of(like: Tensor, host: np.ndarray) -> Tensor:
    """A host array as a Tensor on ``like``'s device."""
    return Tensor._wrap(devices.to_device(host, like._device), like._device)


def _topological(start: Node) -> list[Node]:
    """Nodes reachable from ``start``, each after every node that consumes its outputs."""
    consumers: dict[int, int] = {id(start): 0}
    nodes = {id(start): start}
    stack = [start]
    while stack:
        node = stack.pop()
        for inp in node.inputs or ():
            if inp is not None and inp._node is not None:
                key = id(inp._node)
                if key not in consumers:
                    consumers[key] = 0
                    nodes[key] = inp._node
                    stack.append(inp._node)
                consumers[key] += 1
    order: list[Node] = []
    ready = [start]
    while ready:
        node = ready.pop()
        order.append(node)
        for inp in node.inputs or ():
            if inp is not None and inp._node is not None:
                key = id(inp._node)
                consumers[key] -= 1
                if consumers[key] == 0:
                    ready.append(inp._node)
    return order


from . import devices  # noqa: E402
from .tensor import Tensor  # noqa: E402 - tensor imports dispatch, which imports this module
