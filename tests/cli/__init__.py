"""The command contract: exit codes, messages and the advice they print, help, --json and
the other output formats, logs and metrics."""
