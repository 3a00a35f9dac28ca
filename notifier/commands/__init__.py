"""The commands of `notifier`, one module per concern. Each adds its commands to the group in
cli.py as it is imported; cli.py imports this package once the group is defined."""

from . import approval, observing, operator, resume, sandbox, send, suppress

__all__ = ["approval", "observing", "operator", "resume", "sandbox", "send", "suppress"]
