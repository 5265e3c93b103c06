"""ONNX import adapters: how an older opset's form of an op becomes the op set's form.

The op set follows the latest ONNX forms (attributes that later opsets turned into inputs are
inputs). A file written at an older opset, or with a deprecated op, is brought to that form on
import by small adapters registered next to the op they serve::

    @onnx_adapter("Split")
    def _split_attribute(node: ImportNode) -> None:
        if "split" in node.attrs:
            node.need(1)
            node.inputs = [node.inputs[0], node.const(node.attrs.pop("split"))]

An adapter sees one node (``ImportNode``), may rewrite its inputs and attributes, rename its op
(``node.op = "Resize"`` for a legacy ``Upsample``), add constants (``node.const``) and nodes
before it (``node.emit``), or replace it whole (emit the replacement, then set
``node.replaced = True``). ``before=N`` limits an adapter to files whose default-domain opset is
below ``N``. The importer (in the onnx plugin) implements ``ImportNode``; nothing here imports
ONNX.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..dtype import DType
from ..errors import OneModelError


class ImportNode(ABC):
    """One node of a file being imported, as adapters see it (the importer fills it in)."""

    op: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any]
    opset: int
    label: str  # "node Range__17 (Range, domain ai.onnx, opset 11)": for error messages
    replaced: bool = False

    @abstractmethod
    def const(self, values: Any, dtype: Any = np.int64) -> str:
        """Add a constant and return the name to use as an input."""

    @abstractmethod
    def emit(self, op: str, inputs: Sequence[str], attrs: dict[str, Any] | None = None,
             outputs: int = 1, names: Sequence[str] | None = None) -> list[str]:
        """Add a node of the op set before this one; returns its output names: ``names`` when
        given (a replacement producing this node's outputs), else ``outputs`` fresh ones."""

    @abstractmethod
    def dtype(self, code: int) -> DType:
        """The DType of an ONNX element-type number (a ``to`` or ``dtype`` attribute)."""

    @abstractmethod
    def error(self, message: str) -> OneModelError:
        """An error about this node of the file, naming it (raise what this returns)."""

    def need(self, count: int) -> None:
        """Adapters read inputs by position: refuse a node that lacks the first ``count``."""
        if len(self.inputs) < count or not all(self.inputs[:count]):
            given = [i for i in self.inputs if i] or "none"
            raise self.error(f"{self.op} needs {count} input(s), the node gives {given}")


Adapter = Callable[[ImportNode], None]

# op name -> [(first opset the adapter no longer applies to, or None for every opset, adapter)]
ONNX_ADAPTERS: dict[str, list[tuple[int | None, Adapter]]] = {}


def onnx_adapter(*ops: str, before: int | None = None) -> Callable[[Adapter], Adapter]:
    """Register an import adapter for ``ops`` (in files below opset ``before``, if given)."""

    def register(fn: Adapter) -> Adapter:
        for op in ops:
            ONNX_ADAPTERS.setdefault(op, []).append((before, fn))
        return fn

    return register


def adapters_for(op: str, opset: int) -> list[Adapter]:
    """The adapters that apply to ``op`` in a file of default-domain opset ``opset``, in the
    order they were registered."""
    return [fn for before, fn in ONNX_ADAPTERS.get(op, ()) if before is None or opset < before]


def attribute_to_input(node: ImportNode, attr: str, position: int, dtype: Any = np.int64) -> None:
    """The common upgrade: attribute ``attr`` of an older opset became input ``position``."""
    if attr not in node.attrs:
        return
    node.need(1)
    value = node.attrs.pop(attr)
    inputs = list(node.inputs) + [""] * max(0, position - len(node.inputs))
    inputs[position:position + 1] = [node.const(value, dtype)]
    node.inputs = inputs
