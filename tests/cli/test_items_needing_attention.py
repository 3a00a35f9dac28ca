"""`status` lists the items someone has to look at: unknown, failed, in flight, and every
pending item that was attempted and waits to retry, with its last error (a recipient's
`450 4.2.1` at RCPT retries on its own backoff, and says so here while it waits). The
table fits the terminal: at 80 columns an ordinary row takes at most 3 lines."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from notifier.ops import report

from ..conftest import Workspace, make_rows
from ..smtp_relay import relay

# A retry waits long enough to pause the run (--max-wait 0), with attempts to spare.
LONG_BACKOFF = "\n[retry]\nmax_attempts = 10\nbackoff_base = 30\nbackoff_max = 30\n"


def _paused_on_a_rcpt_450(ws: Workspace) -> None:
    """A run of 4 whose u3 the relay answers `450 4.2.1` at RCPT: paused (exit 3) while u3
    waits for its own retry, the others sent."""
    with relay(ws, LONG_BACKOFF) as handler:
        handler.rcpt_answers = {"user3@example.com": "450 4.2.1 Mailbox busy, try later"}
        ws.write_csv("b.csv", make_rows(4))
        sent = ws.invoke("send", "b.csv", "--channel", "mail", "--max-wait", "0")
        assert sent.exit_code == 3, sent.output


@pytest.mark.both_stores
def test_an_item_waiting_to_retry_after_a_rcpt_450_is_listed_with_its_error(
    ws: Workspace,
) -> None:
    """The relay answers `450 4.2.1` at RCPT for one recipient: the others are sent, the
    run pauses while that item waits for its own retry, and `status` lists it among the
    items needing attention, pending (retry waiting), with the relay's answer."""
    _paused_on_a_rcpt_450(ws)
    states = ws.ledger.states()
    assert states == {"u1": "sent", "u2": "sent", "u3": "pending", "u4": "sent"}
    table = ws.invoke("status").output
    assert "items needing attention" in table, table
    attention = table[table.index("items needing attention") :]
    rows = [line for line in attention.splitlines() if " u3 " in f" {line} "]
    assert rows, attention
    assert "retry_waiting" in attention and "450 4.2.1" in attention
    assert "u1" not in attention and "u2" not in attention and "u4" not in attention


def test_status_on_an_80_column_terminal_fits_every_line(ws: Workspace) -> None:
    """`status` with stdout an 80-column terminal (a pty, COLUMNS=80): every line fits in
    80 columns, the waiting item still listed."""
    _paused_on_a_rcpt_450(ws)
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 80, 0, 0))
    process = subprocess.Popen(
        [sys.executable, "-m", "notifier", "--db", str(ws.db), "status"],
        cwd=ws.path,
        env={**os.environ, "TERM": "xterm", "COLUMNS": "80", "NO_COLOR": "1"},
        stdout=follower,
        stderr=subprocess.DEVNULL,
    )
    os.close(follower)
    shown = b""
    try:
        while True:  # until the process closes the terminal
            try:
                chunk = os.read(leader, 65536)
            except OSError:
                break
            if not chunk:
                break
            shown += chunk
    finally:
        os.close(leader)
    assert process.wait(timeout=60) == 0
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", shown.decode()).replace("\r", "")
    assert all(len(line) <= 80 for line in text.splitlines()), text
    attention = text[text.index("items needing attention") :]
    assert " u3 " in attention and "RCPT" in attention, text


def _report(items: list[dict[str, Any]]) -> dict[str, Any]:
    """A report object as report.build makes it, with only what the table shows."""
    return {
        "run_id": "run-20261206-073609-0061a5",
        "state": "paused",
        "fingerprint": "sha256:" + "a" * 64,
        "counts": {"total": 100, "sent": 97, "unknown": 1, "pending": 1, "failed": 1},
        "pending_detail": {"never_attempted": 0, "retry_waiting": 1, "maybe_delivered": 0},
        "items": items,
        "decisions": [],
    }


def _ordinary_items() -> list[dict[str, Any]]:
    """Three items with ordinary values: ids of 10 characters, recipients of about 30, a
    last error of about 80."""
    error = "smtp channel 'mail': mx.example.com temporarily refused the recipient (450 4.2.1)"
    return [
        {
            "seq": 1000 + k,
            "id": f"order-{k:04d}",
            "to": f"customer.number{k:03d}@example-mail.com",
            "state": state,
            "pending_kind": "retry_waiting" if state == "pending" else None,
            "attempts": 3,
            "idempotency_key": f"ntf1-b0dbe20d5ae56742f7faa552340b8ca3733458{k}",
            "last_error": error,
        }
        for k, state in enumerate(("unknown", "failed", "pending"), start=1)
    ]


def _attention_rows(rendered: str) -> list[list[str]]:
    """The lines of each row of the attention table: a row starts on the line that shows
    its seq in the first column; its folded lines follow, blank in that column."""
    lines = rendered[rendered.index("items needing attention") :].splitlines()
    seqs = {str(item["seq"]) for item in _ordinary_items()}
    rows: list[list[str]] = []
    for line in lines:
        bare = line.replace("│", " ").replace("┃", " ")
        if bare[:6].strip() in seqs:
            rows.append([line])
        elif rows and not bare[:6].strip() and bare.strip():
            rows[-1].append(line)  # a folded line: nothing in the seq column
        elif rows:
            break
    return rows


@pytest.mark.parametrize("width", [80, 100])
def test_each_attention_row_takes_at_most_3_lines_on_a_narrow_terminal(width: int) -> None:
    """At 80 (and 100) columns every line fits the width and each of the three ordinary
    rows takes at most 3 lines, every value folded, none cut short."""
    console = Console(width=width, markup=False, record=True, file=io.StringIO())
    report.render_table(_report(_ordinary_items()), console)
    rendered = console.export_text()
    assert all(len(line) <= width for line in rendered.splitlines()), rendered
    rows = _attention_rows(rendered)
    assert len(rows) == 3, rendered
    assert max(len(row) for row in rows) <= 3, rendered
    assert "…" not in rendered  # folded, never cut short


def test_a_wide_terminal_shows_every_column_and_the_key_unfolded() -> None:
    """At 200 columns (a pipe) the table keeps the idempotency key, whole on one line, and
    each row takes at most 2 lines."""
    console = Console(width=200, markup=False, record=True, file=io.StringIO())
    report.render_table(_report(_ordinary_items()), console)
    rendered = console.export_text()
    rows = _attention_rows(rendered)
    assert len(rows) == 3 and max(len(row) for row in rows) <= 2, rendered
    assert all(item["idempotency_key"] in rendered for item in _ordinary_items())


@given(
    st.lists(st.tuples(st.integers(1, 200), st.booleans()), min_size=1, max_size=8),
    st.integers(20, 300),
)
def test_fitted_widths_stay_within_the_room_and_the_content(
    columns: list[tuple[int, bool]], room: int
) -> None:
    """Whatever the content and the room: either every column keeps its content's width
    (None), or the widths fit in the room, no column is wider than its content, and the
    columns that do not fold keep their width."""
    natural = [w for w, _ in columns]
    folds = [f for _, f in columns]
    widths = report.fit_widths(natural, folds, room, lambda n, w: -(-natural[n] // w))
    if None in widths:
        assert widths == [None] * len(columns)
        return
    fitted = [w for w in widths if w is not None]
    assert sum(fitted) <= room
    assert all(1 <= w <= n for w, n in zip(fitted, natural, strict=True))
    assert all(w == n for w, n, f in zip(fitted, natural, folds, strict=True) if not f)
