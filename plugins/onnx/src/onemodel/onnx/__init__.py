"""onemodel.onnx: ONNX export and import, a serializer plugin of the onemodel registry."""

__version__ = "0.1.0"
