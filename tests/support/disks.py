"""A small disk for a test's database: a tmpfs of a given size (root on Linux, the test
skipped elsewhere), filled on demand, and the CLI run on a database there."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from notifier.cli import cli

from .workspace import Workspace


def tmpfs(ws: Workspace, size: str) -> Iterator[Path]:
    """A tmpfs of `size` (mount's notation) mounted in the workspace for the test."""
    if sys.platform != "linux" or os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root on Linux")
    disk = ws.path / f"disk-{size}"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)],  # noqa: S607
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)  # noqa: S607


def fill(disk: Path) -> Path:
    """Every free block of `disk` taken by one file of zeros, returned (unlink it for room)."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)
    return filler


def notifier(db: Path, *args: str) -> Result:
    """The CLI in-process on `db` (not ws.db: the database lives on the small disk), given
    by NOTIFIER_DB as an operator's shell gives it."""
    return CliRunner().invoke(cli, list(args), env={"NOTIFIER_DB": str(db)}, catch_exceptions=False)
