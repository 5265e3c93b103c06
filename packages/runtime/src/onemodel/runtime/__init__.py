"""onemodel.runtime: the graph IR, the inference Session, passes, planner and executor."""

__version__ = "0.1.0"
