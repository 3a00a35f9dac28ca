"""Ctrl-C outside a send says truly what was kept: while the batch is still being planned
it stores nothing and exits 130 with one line, and at a prompt of `reconcile --manual` it
keeps the decisions already given, exits 130 and says which were recorded and what is left
(never click's `Aborted!`, an internal error or a silent exit 3). Real processes, since
only they get the signal; on both stores."""

from __future__ import annotations

import errno
import os
import select
import signal
import subprocess
import sys
import time

import pytest

from ..cli.test_reconcile_and_report import two_unknown_items
from ..conftest import Inbox, Workspace


def start(ws: Workspace, *args: str, stdin: int | None = None) -> subprocess.Popen[bytes]:
    """`notifier --db <ws.db> ARGS` as a real process that Ctrl-C (SIGINT) reaches, even when
    the suite itself was started with SIGINT ignored (a background job of a shell)."""
    return subprocess.Popen(
        [sys.executable, "-m", "notifier", "--db", str(ws.db), *args],
        cwd=ws.path,
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=_default_sigint,  # noqa: PLW1509 (one signal() call: no lock, no import)
    )


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def read_until(proc: subprocess.Popen[bytes], marker: bytes, times: int = 1) -> bytes:
    """What the process wrote on stdout until `marker` has appeared `times` times."""
    assert proc.stdout is not None
    seen = b""
    deadline = time.monotonic() + 60
    while seen.count(marker) < times:
        assert time.monotonic() < deadline, seen
        ready, _, _ = select.select([proc.stdout], [], [], 1)
        if ready:
            chunk = os.read(proc.stdout.fileno(), 65536)
            assert chunk, f"the process ended before {marker!r}: {seen!r}"
            seen += chunk
    return seen


@pytest.mark.both_stores
def test_ctrl_c_while_planning_stores_nothing_and_exits_130(ws: Workspace) -> None:
    """Ctrl-C while the batch is still being read and validated stores nothing and exits 130
    with a one-line message, not exit 1 with click's `Aborted!`."""
    fifo = ws.path / "batch.csv"
    os.mkfifo(fifo)  # the process reads what we write: it is planning until we close it
    proc = start(ws, "send", str(fifo))
    deadline = time.monotonic() + 60
    while True:  # opening the write end succeeds once the process opened the file to read it
        try:
            writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError as exc:
            assert exc.errno == errno.ENXIO, exc
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the process never opened the batch"
            time.sleep(0.02)
    try:
        os.write(writer, b"id,to,subject,body\nu1,a@x.example,S,B\n")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        os.close(writer)
    assert proc.returncode == 130, (out, err)
    lines = err.decode().strip().splitlines()
    assert len(lines) == 1 and "nothing was stored" in lines[0], lines
    assert "Aborted" not in lines[0] and "internal error" not in lines[0]
    assert not ws.has_database()


@pytest.mark.both_stores
def test_ctrl_c_in_manual_reconcile_exits_130_saying_what_was_recorded(
    ws: Workspace, inbox: Inbox
) -> None:
    """Ctrl-C at the second prompt of `reconcile --manual` keeps the first decision, exits
    130 and says which decision was recorded and what is left, not exit 3 in silence."""
    run_id = two_unknown_items(ws)
    proc = start(ws, "reconcile", "--manual", stdin=subprocess.PIPE)
    assert proc.stdin is not None
    read_until(proc, b"delivered?")
    proc.stdin.write(b"s\nseen in the mail log\n")
    proc.stdin.flush()
    read_until(proc, b"delivered?")  # u2's prompt: u1's decision is recorded
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    lines = err.decode().strip().splitlines()
    assert len(lines) == 1, lines
    assert "1 decision(s) recorded" in lines[0] and "item u1 → sent" in lines[0], lines
    assert "1 unknown item(s) left" in lines[0] and f"reconcile --manual {run_id}" in lines[0]
    assert [(seq, decision) for seq, decision, _ in ws.ledger.decisions()] == [(1, "mark_sent")]
    states = ws.ledger.states()
    assert states == {"u1": "sent", "u2": "unknown", "u3": "sent"}


def test_ctrl_c_while_reading_rows_piped_in_stores_nothing_and_keeps_no_spool(
    ws: Workspace,
) -> None:
    """Ctrl-C while `send -` still reads standard input into its spool exits 130 saying
    nothing was stored and to pipe the rows in again (not that a run can be resumed), and
    removes the spool at once: it holds recipients, and nothing else would remove it."""
    tmp = ws.path / "tmp"
    tmp.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "notifier", "--db", str(ws.db), "send", "-"],
        cwd=ws.path,
        env={**os.environ, "TMPDIR": str(tmp)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=_default_sigint,  # noqa: PLW1509 (one signal() call: no lock, no import)
    )
    assert proc.stdin is not None
    proc.stdin.write(b"id,to,subject,body\nu1,a@x.example,S,B\n")
    proc.stdin.flush()
    deadline = time.monotonic() + 60
    while not any(tmp.glob("notifier-stdin-*/stdin.csv")):  # the rows are being spooled
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the process never spooled its input"
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (out, err)
    lines = err.decode().strip().splitlines()
    assert len(lines) == 1 and "standard input" in lines[0], lines
    assert "nothing was stored" in lines[0] and "notifier send -" in lines[0], lines
    assert "resume" not in lines[0], lines
    assert list(tmp.iterdir()) == []
    assert not ws.has_database()
