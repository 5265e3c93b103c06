"""The ``onemodel`` command: inspect, run, convert, check and benchmark saved models.

Subcommands come from the registry (``onemodel_register_commands``), so an installed plugin can
add its own; the runtime's are registered the same way.
"""

from .app import main

__all__ = ["main"]
