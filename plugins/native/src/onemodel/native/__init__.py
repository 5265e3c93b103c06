"""onemodel.native: the native .onemodel file format, a serializer plugin of the registry."""

__version__ = "0.1.0"
