"""An example OneModel backend: device "sim" (host arrays in a wrapper type)."""

__version__ = "0.1.0"
