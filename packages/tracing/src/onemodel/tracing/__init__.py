"""onemodel.tracing: `Tracer`, `TracedModel` and `TraceError`."""

__version__ = "0.1.0"
