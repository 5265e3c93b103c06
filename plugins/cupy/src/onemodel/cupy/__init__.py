"""onemodel.cupy: the ``"cuda"`` device (CuPy kernels and host transfers), a plugin of the
onemodel registry. Importing it imports no CuPy; the kernels import it on first use."""

__version__ = "0.1.0"
