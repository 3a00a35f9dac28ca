"""`python -m notifier` and the `notifier` command (pyproject's entry point): `run`."""

from __future__ import annotations


def run() -> None:
    """The command line, loaded inside a guard: Ctrl-C while Python loads it (before any
    signal handler is installed, nothing read or stored yet) ends the command with the
    contract's 130, never Python's KeyboardInterrupt traceback."""
    try:
        from notifier.cli import main  # noqa: PLC0415 (loaded inside the guard)
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    main()


if __name__ == "__main__":
    run()
