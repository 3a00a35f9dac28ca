"""`python -m notifier` is the `notifier` command."""

from notifier.cli import main

main()
