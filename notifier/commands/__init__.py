"""The commands of `notifier`, one module per concern. Each adds its commands to the group in
group.py as it is imported; cli.py imports them all (this package imports none of them, so
that importing the group does not import the commands that import it)."""
