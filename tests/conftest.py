"""Shared fixtures: every test works in its own directory with its own receipts.db, and
drives the real CLI (in-process with CliRunner, or as a subprocess where it must die)."""

from __future__ import annotations

import csv
import json
import os
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from email import message_from_bytes
from email.message import Message
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, Envelope, Session
from click.testing import CliRunner, Result

from notifier.cli import cli

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "batch.csv"


@dataclass
class Workspace:
    """A directory holding one database, its outbox and any batch files a test writes."""

    path: Path

    @property
    def db(self) -> Path:
        return self.path / "receipts.db"

    @property
    def outbox(self) -> Path:
        return self.path / "outbox"

    def invoke(
        self, *args: str, input: str | None = None, env: dict[str, str] | None = None
    ) -> Result:
        """Run the CLI in-process, as `notifier --db <ws>/receipts.db ARGS`."""
        return CliRunner().invoke(
            cli, ["--db", str(self.db), *args], input=input, env=env, catch_exceptions=False
        )

    def run(
        self, *args: str, env: dict[str, str] | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run the CLI as a real process (needed where it must die or be signalled)."""
        return subprocess.run(
            [sys.executable, "-m", "notifier", "--db", str(self.db), *args],
            cwd=self.path,
            env={**os.environ, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,  # the exit status is what most tests assert on
        )

    def popen(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "notifier", "--db", str(self.db), *args],
            cwd=self.path,
            env={**os.environ, **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def write_csv(self, name: str, rows: Sequence[Sequence[str]]) -> Path:
        path = self.path / name
        with path.open("w", newline="", encoding="utf-8") as handle:
            csv.writer(handle).writerows(rows)
        return path

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Read the real database file with plain sqlite3, as an operator would (read-only:
        a test must never create the file a worker is about to create)."""
        conn = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True)
        try:
            return [tuple(r) for r in conn.execute(sql, params)]
        finally:
            conn.close()

    def outbox_documents(self) -> list[dict[str, Any]]:
        if not self.outbox.exists():
            return []
        return [json.loads(p.read_text("utf-8")) for p in sorted(self.outbox.glob("*.json"))]

    def status(self) -> dict[str, Any]:
        result = self.invoke("status", "--json")
        assert result.exit_code == 0, result.output
        data: dict[str, Any] = json.loads(result.output)
        return data


@pytest.fixture
def ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Workspace]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("NOTIFIER_CRASH_AT", raising=False)
    monkeypatch.delenv("NOTIFIER_DB", raising=False)
    workspace = Workspace(tmp_path)
    yield workspace
    assert_counters_match_items(workspace.db)


def assert_counters_match_items(db: Path) -> None:
    """After every test: m004's per-run counters equal a count of the item rows, whatever
    moves the test made (so the whole suite checks that no move path skips them)."""
    if not db.exists():
        return
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            if not conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'run_counts'"
            ).fetchone():
                return
            kept = set(conn.execute("SELECT run_id, state, n FROM run_counts WHERE n != 0"))
            counted = set(
                conn.execute("SELECT run_id, state, COUNT(*) FROM items GROUP BY run_id, state")
            )
        finally:
            conn.close()
    except sqlite3.DatabaseError:
        return  # a test that damaged or replaced the file on purpose
    assert kept == counted, f"run_counts drifted from the items: {kept ^ counted}"


def make_rows(n: int, *, start: int = 1) -> list[list[str]]:
    """A header and `n` plain rows addressed to example.com."""
    rows = [["id", "to", "subject", "body", "name"]]
    for i in range(start, start + n):
        rows.append([f"u{i}", f"user{i}@example.com", f"Hello {i}", f"Body of {i}", f"User {i}"])
    return rows


class Inbox:
    """An aiosmtpd handler keeping every message it accepted."""

    def __init__(self) -> None:
        self.messages: list[Message] = []

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        content = envelope.content
        assert isinstance(content, bytes)
        self.messages.append(message_from_bytes(content))
        return "250 OK"

    def message_ids(self) -> list[str]:
        return [str(m["Message-ID"]) for m in self.messages]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def inbox(ws: Workspace) -> Iterator[Inbox]:
    """A real SMTP server on 127.0.0.1 and a `mail` channel pointing at it."""
    handler = Inbox()
    port = free_port()
    controller = Controller(handler, hostname="127.0.0.1", port=port)
    controller.start()
    (ws.path / "notifier.toml").write_text(
        f'[channels.mail]\ntype = "smtp"\nhost = "127.0.0.1"\nport = {port}\n'
        'sender = "ops@example.com"\n'
    )
    try:
        yield handler
    finally:
        controller.stop()
