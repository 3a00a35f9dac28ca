"""A file a command writes (`export --to`, `preview --output`) that cannot be opened, in a
directory that is not there or not writable, is exit 2 naming the path and the cause; a
disk that fills while it is written is exit 3 naming the disk, as for the database
(docs/design.md, exit codes). Never an internal error, and the database is never changed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ..conftest import Workspace, make_rows

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def planned(ws: Workspace) -> Workspace:
    ws.write_csv("b.csv", make_rows(3))
    assert ws.invoke("send", "b.csv", "--require-approval").exit_code == 0
    return ws


def test_export_to_a_directory_that_is_not_there_exits_2_naming_the_path(
    planned: Workspace,
) -> None:
    to = planned.path / "no" / "such" / "audit.db"
    result = planned.invoke("export", "--to", str(to))
    assert result.exit_code == 2, result.output
    assert str(to) in result.output and "No such file or directory" in result.output
    assert "internal error" not in result.output and "Traceback" not in result.output
    assert not to.parent.exists()


@pytest.mark.parametrize("fmt", ["table", "jsonl"])
def test_preview_to_a_directory_that_is_not_there_exits_2_naming_the_path(
    planned: Workspace, fmt: str
) -> None:
    output = Path("missing-dir") / "x.csv"
    result = planned.invoke("preview", "--format", fmt, "--output", str(output))
    assert result.exit_code == 2, result.output
    assert str(output) in result.output and "No such file or directory" in result.output
    assert "internal error" not in result.output and "Traceback" not in result.output


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_preview_to_a_full_disk_exits_3_naming_the_disk(planned: Workspace) -> None:
    """/dev/full answers every write with ENOSPC, as a disk that filled does."""
    result = planned.invoke("preview", "--format", "jsonl", "--output", "/dev/full")
    assert result.exit_code == 3, result.output
    assert "/dev/full" in result.output and "full" in result.output
    assert "internal error" not in result.output and "Traceback" not in result.output
