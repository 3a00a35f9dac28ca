"""A command whose standard output fills its disk (`notifier metrics > textfile/notifier.prom`
for node_exporter, `report --format csv > items.csv`, a send logged to a file) says so: exit
3 naming the full disk and that the output is incomplete, as a full disk is for the
database and for `preview --output` (docs/design.md, exit codes), and what to do next; never
an "internal error" (exit 1) that calls notifier broken and keeps quiet about the half file.
A send cut short so is continued by `notifier resume`, each row sent once. /dev/full answers
every write with ENOSPC, as a disk that filled does."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ..conftest import Workspace, default_sigint, make_rows

pytestmark = [
    pytest.mark.both_stores,
    pytest.mark.timeout(120),
    pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)"),
]


def run_into_a_full_disk(ws: Workspace, *args: str) -> subprocess.CompletedProcess[str]:
    """`notifier ARGS > /dev/full`, as a real process (its stdout a file on a full disk)."""
    with open("/dev/full", "w") as full:
        return subprocess.run(
            [sys.executable, "-m", "notifier", *args],
            cwd=ws.path,
            env={**os.environ, "NOTIFIER_DB": str(ws.db)},
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
            preexec_fn=default_sigint,
        )


def assert_named(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 3, result.stderr
    assert "full" in result.stderr and "incomplete" in result.stderr, result.stderr
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "command",
    [
        ["metrics"],
        ["report", "--json"],
        ["report", "--format", "csv"],
        ["report"],
        ["status"],
        ["status", "--json"],
        ["runs", "--json"],
    ],
)
def test_a_look_whose_output_fills_its_disk_exits_3_naming_it(
    ws: Workspace, command: list[str]
) -> None:
    ws.write_csv("batch.csv", make_rows(3))
    assert ws.invoke("send", "batch.csv", "--run-id", "r1").exit_code == 0
    result = run_into_a_full_disk(ws, *command)
    assert_named(result)
    assert "run the same command again" in result.stderr, result.stderr


def test_a_send_whose_output_fills_its_disk_exits_3_and_resume_sends_each_row_once(
    ws: Workspace,
) -> None:
    ws.write_csv("batch.csv", make_rows(3))
    result = run_into_a_full_disk(ws, "send", "batch.csv", "--run-id", "r1")
    assert_named(result)
    assert "`notifier resume` continues it" in result.stderr, result.stderr
    resumed = ws.invoke("resume", "r1")
    assert resumed.exit_code == 0, resumed.output
    assert ws.ledger.state_counts() == {"sent": 3}
    assert len(ws.outbox_documents()) == 3
