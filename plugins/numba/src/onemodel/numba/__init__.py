"""onemodel.numba: numba-JIT CPU kernels, a plugin of the onemodel registry."""

__version__ = "0.1.0"
