"""`python -m notifier` is the `notifier` command."""

from .cli import main

main()
