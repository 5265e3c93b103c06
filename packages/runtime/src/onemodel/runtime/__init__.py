"""onemodel.runtime: the graph IR, the inference Session, passes, planner and executor."""

from onemodel.tensors import registry as _registry

_registry.register_builtin("onemodel-runtime.builtins", "onemodel.runtime.plugin",
                           "onemodel-runtime")

from .builder import GraphBuilder  # noqa: E402
from .graph import Graph, GraphError, Node, ValueInfo  # noqa: E402
from .planner import ExecutionError  # noqa: E402
from .serializers import FormatNotInstalledError, load, save  # noqa: E402
from .session import IOInfo, Session  # noqa: E402

__version__ = "0.1.0"

__all__ = ["ExecutionError", "FormatNotInstalledError", "Graph", "GraphBuilder", "GraphError",
           "IOInfo", "Node", "Session", "ValueInfo", "load", "save"]
