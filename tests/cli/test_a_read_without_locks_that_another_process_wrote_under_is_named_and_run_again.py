"""A read-only command that read an SQLite file without SQLite's locks, while another process
wrote into it, says so and is run again: never a silent mix of two moments, never an
internal error, never "damaged".

A read-only command (`status`, `report`, `runs`, `metrics`, `suppress list`) that finds no
-wal beside the file reads it `immutable`: no locks, and no -wal/-shm left behind
(test_readonly.py). Another process that opens the file meanwhile (a `send` planning, a
`suppress import`) and checkpoints its writes into it changes the pages under that read.
Here that process writes and checkpoints (`PRAGMA wal_checkpoint(TRUNCATE)`) exactly after
the command has read some rows; the command then exits 3 naming the file, that another
process wrote it while it read, that what it printed may mix two moments and that nothing
was changed, and advises running the same command again, which then succeeds. A read that
meets what such a write leaves (`database disk image is malformed`, text that does not
decode) ends the same way. The same failure without a write under the read stays what it
was. PostgreSQL reads one MVCC snapshot: a write under its read changes nothing there."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from notifier.api import Notifier
from notifier.domain.errors import ExitCode, NotifierError
from notifier.ops import report
from notifier.store import drafts
from notifier.store.queries import Queries
from notifier.store.suppressions import Suppressions

from ..conftest import EXAMPLE, Workspace

# Each read-only command, and the read after which the other process writes (the command
# has read some rows by then, and reads more after it).
COMMANDS: dict[str, tuple[list[str], tuple[Any, str]]] = {
    "status": (["status"], (report, "run_counts")),
    "status-json": (["status", "--json"], (report, "run_counts")),
    "report": (["report"], (report, "run_counts")),
    "report-csv": (["report", "--format", "csv"], (report, "run_counts")),
    "runs": (["runs"], (drafts, "run_counts")),
    "runs-json": (["runs", "--json"], (drafts, "run_counts")),
    "metrics": (["metrics"], (drafts, "run_counts")),
    "suppress-list": (["suppress", "list"], (Suppressions, "suppressions")),
}

MALFORMED = sqlite3.DatabaseError("database disk image is malformed")
UNDECODABLE = sqlite3.OperationalError("Could not decode to UTF-8 column 'to' with text 'x\\xff'")


def sidecars(ws: Workspace) -> list[str]:
    return sorted(p.name for p in ws.path.iterdir() if p.name.startswith("receipts.db-"))


def another_process_writes(db: Path | str) -> None:
    """Another process's write, checkpointed into the file: 300 suppressions (with their
    audit), enough to grow the file by many pages. Its last connection closing removes the
    -wal again, as any notifier command leaves the file."""
    if isinstance(db, str):  # PostgreSQL: another session commits
        with psycopg.connect(db, autocommit=True) as pg:
            for i in range(300):
                pg.execute(
                    "INSERT INTO suppressions (address, reason, source, operator, created_at) "
                    "VALUES (%s, %s, 'import', 'other-writer', '2030-01-01T00:00:00Z')",
                    (f"other{i}@example.org", "r" * 100),
                )
        return
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        for i in range(300):
            address = f"other{i}@example.org"
            conn.execute(
                "INSERT INTO suppressions (address, reason, source, operator, created_at) "
                "VALUES (?, ?, 'import', 'other-writer', '2030-01-01T00:00:00Z')",
                (address, "r" * 100),
            )
            conn.execute(
                "INSERT INTO suppression_audit (at, operator, action, address, source, reason) "
                "VALUES ('2030-01-01T00:00:00Z', 'other-writer', 'add', ?, 'import', ?)",
                (address, "r" * 100),
            )
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


class Under:
    """Patches the read at `seam` so that, the first time it has returned, another process
    writes into the database (and then, with `then_raises`, the read fails as a torn read
    may). `after` holds the database's bytes right after that write (SQLite)."""

    def __init__(self, ws: Workspace, monkeypatch: pytest.MonkeyPatch, seam: tuple[Any, str],
                 *, write: bool = True, then_raises: Exception | None = None) -> None:  # fmt: skip
        self.ws, self.write, self.then_raises = ws, write, then_raises
        self.done = False
        self.after: bytes | None = None
        owner, name = seam
        original: Callable[..., Any] = getattr(owner, name)

        def read(*args: Any, **kwargs: Any) -> Any:  # a function: a method binds it too
            rows = original(*args, **kwargs)
            if not self.done:
                self.done = True
                if self.write:
                    another_process_writes(self.ws.db)
                    if not self.ws.url:
                        self.after = self.ws.db_file.read_bytes()
                if self.then_raises is not None:
                    raise self.then_raises
            return rows

        monkeypatch.setattr(owner, name, read)


@pytest.fixture
def sent(ws: Workspace) -> Iterator[Workspace]:
    """A finished run (every item delivered), its database closed: no -wal beside it."""
    assert ws.invoke("send", str(EXAMPLE), "--run-id", "r1").exit_code == 0
    if not ws.url:
        assert sidecars(ws) == []
    yield ws


def assert_named_and_run_again(ws: Workspace, under: Under, output: str, exit_code: int,
                               args: list[str]) -> None:  # fmt: skip
    assert under.done
    assert "internal error" not in output, output
    assert "damaged" not in output and "notifier verify" not in output, output
    assert exit_code == ExitCode.ATTENTION, output
    assert str(ws.db_file) in output, output
    assert "another process wrote" in output, output
    assert "without locks" in output, output
    assert "may mix two moments" in output, output
    assert "Nothing was changed" in output, output
    assert "run the same command again" in output.lower(), output
    # Nothing changed by this command: the file as the other process left it, no sidecars.
    assert ws.db_file.read_bytes() == under.after
    assert sidecars(ws) == []
    again = ws.invoke(*args)
    assert again.exit_code == 0, again.output
    assert "another process wrote" not in again.output


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_read_another_process_wrote_under_is_named_and_run_again(
    sent: Workspace, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    args, seam = COMMANDS[command]
    under = Under(sent, monkeypatch, seam)
    result = sent.invoke(*args)
    monkeypatch.undo()
    assert_named_and_run_again(sent, under, result.output, result.exit_code, args)


@pytest.mark.parametrize("error", [MALFORMED, UNDECODABLE], ids=["malformed", "undecodable"])
@pytest.mark.parametrize("command", ["report", "runs", "suppress-list"])
def test_a_read_that_fails_after_another_process_wrote_under_it_is_named_and_run_again(
    sent: Workspace, monkeypatch: pytest.MonkeyPatch, command: str, error: Exception
) -> None:
    """`database disk image is malformed`, or text that does not decode, met by a read the
    file changed under: the same failure, never an internal error (exit 1) nor a damaged
    database (exit 4, "run verify") for a healthy file."""
    args, seam = COMMANDS[command]
    under = Under(sent, monkeypatch, seam, then_raises=error)
    result = sent.invoke(*args)
    monkeypatch.undo()
    assert_named_and_run_again(sent, under, result.output, result.exit_code, args)


@pytest.mark.parametrize(
    ("error", "exit_code"),
    [(MALFORMED, ExitCode.INTERNAL), (UNDECODABLE, ExitCode.REFUSED)],
    ids=["malformed", "undecodable"],
)
def test_the_same_failure_with_no_write_under_the_read_is_not_called_a_race(
    sent: Workspace, monkeypatch: pytest.MonkeyPatch, error: Exception, exit_code: ExitCode
) -> None:
    """The file as it was when the read began: its failure is what it says (a damaged
    file, or an error), never blamed on another process."""
    under = Under(sent, monkeypatch, COMMANDS["report"][1], write=False, then_raises=error)
    result = sent.invoke("report")
    assert under.done
    assert result.exit_code == exit_code, result.output
    assert "another process wrote" not in result.output


def test_the_library_read_another_process_wrote_under_raises_the_same_error(
    sent: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """notifier's Python API: the same typed error (exit code 3), from the call that read."""
    under = Under(sent, monkeypatch, (Queries, "counts"))
    notifier = Notifier.open(sent.db)
    with pytest.raises(NotifierError) as raised:
        notifier.counts("r1")
    assert under.done
    assert raised.value.exit_code == ExitCode.ATTENTION
    assert str(sent.db_file) in str(raised.value)
    assert "another process wrote" in str(raised.value)
    monkeypatch.undo()
    assert notifier.counts("r1").total > 0


@pytest.mark.parametrize("ws", ["postgres"], indirect=True)
@pytest.mark.parametrize("command", ["status-json", "runs-json", "suppress-list"])
def test_on_postgresql_a_write_under_a_read_changes_nothing(
    sent: Workspace, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    """PostgreSQL reads one snapshot under MVCC: a write another session commits under the
    read leaves the command's outcome as it was."""
    args, seam = COMMANDS[command]
    before = sent.invoke(*args)
    assert before.exit_code == 0, before.output
    under = Under(sent, monkeypatch, seam)
    result = sent.invoke(*args)
    assert under.done
    assert result.exit_code == 0, result.output
    assert "another process wrote" not in result.output
