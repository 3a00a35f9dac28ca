"""Ctrl-C while drafting keeps what was already requested. On the synchronous path
the answers in flight are waited for and stored (they are paid for) and a second Ctrl-C
leaves at once; on the batch path polling stops and the submitted batches are left, recorded,
for `resume`. A progress bar shows drafting on a terminal, and nothing elsewhere. Every test
drives the real CLI in a subprocess against the fake Messages API."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator

import pytest

from ..conftest import DB_ERRORS, Workspace, default_sigint, wait_for
from ..engine.test_compose import batch, brief
from ..fake_messages import FakeBatches, FakeMessages, serving


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeBatches]:
    """The fake API (batch endpoints too), the SDK pointed at it, polls 10 ms apart."""
    server = FakeBatches()
    with serving(monkeypatch, server):
        yield server


def events(ws: Workspace, kind: str) -> list[str | None]:
    try:
        return [e.detail for e in ws.ledger.events(kind)]
    except DB_ERRORS:
        return []


def drafts_by_state(ws: Workspace) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for draft in ws.ledger.drafts():
        found.setdefault(draft["state"], []).append(json.loads(draft["source"])["item_id"])
    return found


def stored_drafts(ws: Workspace) -> int:
    try:
        return [d["state"] for d in ws.ledger.drafts()].count("drafted")
    except DB_ERRORS:
        return 0


def test_ctrl_c_waits_for_the_answers_in_flight_stores_them_and_resume_never_asks_again(
    ws: Workspace, fake: FakeMessages
) -> None:
    """Ctrl-C with four requests held by the API: no new request, the four answers that
    arrive after it are stored, exit 130 saying how many were kept; resume drafts only the
    rows never asked for (each row requested exactly once in all)."""
    fake.answer_limit = 2
    fake.answer_held = True
    process = ws.popen("send", str(batch(ws, 8)), "--compose", str(brief(ws)))
    wait_for(lambda: stored_drafts(ws) == 2 and fake.held == 4, "2 drafts stored, 4 held")
    process.send_signal(signal.SIGINT)
    wait_for(lambda: bool(events(ws, "drafting_interrupted")), "the interruption recorded")
    fake.release.set()
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert "interrupted while drafting (Ctrl-C)" in stderr
    assert "the 4 draft(s) answered after the interruption were waited for and kept" in stderr
    assert "6 row(s) drafted, 0 failed, 2 still to draft" in stderr
    assert "`notifier resume " in stderr
    states = drafts_by_state(ws)
    assert sorted(states["drafted"]) == [f"u{i}" for i in range(1, 7)]
    assert sorted(states["pending"]) == ["u7", "u8"]
    assert set(fake.rows_requested()) == {f"u{i}" for i in range(1, 7)}  # nothing new
    assert ws.outbox_documents() == []

    fake.answer_limit = None
    resumed = ws.invoke("resume")
    assert resumed.exit_code == 0, resumed.output
    assert Counter(fake.rows_requested()) == {f"u{i}": 1 for i in range(1, 9)}
    assert len(ws.outbox_documents()) == 8


def test_a_second_ctrl_c_while_answers_are_awaited_leaves_at_once(
    ws: Workspace, fake: FakeMessages
) -> None:
    """A second Ctrl-C does not wait for the held answers: the process exits 130 while the
    API still holds every request."""
    fake.answer_limit = 0
    process = ws.popen("send", str(batch(ws, 4)), "--compose", str(brief(ws)))
    wait_for(lambda: fake.held == 4, "4 requests held")
    process.send_signal(signal.SIGINT)
    wait_for(lambda: bool(events(ws, "drafting_interrupted")), "the interruption recorded")
    process.send_signal(signal.SIGINT)
    # Well under the 30 s the fake holds a request: only leaving at once gets here.
    wait_for(lambda: process.poll() is not None, "the process gone", timeout=20)
    process.communicate(timeout=10)
    assert process.returncode == 130
    assert fake.held == 4, "the process waited for the answers"
    fake.release.set()


def test_ctrl_c_while_polling_batches_leaves_them_for_resume(
    ws: Workspace, fake: FakeBatches
) -> None:
    """Ctrl-C while the batches process: exit 130 naming the batches left with the API and
    `notifier resume`; the chunks stay submitted; resume reads their results without
    creating a batch again, and every row is drafted once."""
    fake.polls_in_progress = 10**6
    process = ws.popen("send", str(batch(ws, 5)), "--compose", str(brief(ws)), "--batch-api")

    def submitted() -> list[str]:
        try:
            chunks = ws.ledger.draft_chunks()
        except DB_ERRORS:
            return []
        return [c["batch_id"] for c in chunks if c["state"] == "submitted"]

    wait_for(lambda: len(submitted()) == 3, "3 chunks submitted")
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert "polling stopped; the 3 batch(es) already submitted" in stderr
    assert all(batch_id in stderr for batch_id in fake.created())
    assert "`notifier resume " in stderr and "without creating them again" in stderr
    assert len(submitted()) == 3 and fake.cancelled == []
    assert events(ws, "drafting_interrupted")

    fake.polls_in_progress = 0
    resumed = ws.invoke("resume")
    assert resumed.exit_code == 0, resumed.output
    assert len(fake.created()) == 3
    assert Counter(fake.succeeded) == {f"u{i}": 1 for i in range(1, 6)}
    assert len(ws.outbox_documents()) == 5


def test_a_progress_bar_shows_drafting_on_a_terminal_and_nothing_in_a_pipe(
    ws: Workspace, fake: FakeMessages
) -> None:
    """With stderr a terminal, a `drafting` bar counts the drafts; with stderr a pipe, no
    bar and no terminal escape codes."""
    fake.answer_limit = 1
    fake.answer_held = True
    leader, follower = pty.openpty()
    command = [sys.executable, "-m", "notifier", "--db", str(ws.db), "send", str(batch(ws, 3))]
    process = subprocess.Popen(
        [*command, "--compose", str(brief(ws))],
        cwd=ws.path,
        env={**os.environ, "TERM": "xterm", "COLUMNS": "100"},
        stdout=subprocess.DEVNULL,
        stderr=follower,
        preexec_fn=default_sigint,  # noqa: PLW1509 (one signal() call, as Workspace.popen)
    )
    os.close(follower)
    shown = b""

    def read_some() -> bool:
        nonlocal shown
        if select.select([leader], [], [], 0.05)[0]:
            try:
                shown += os.read(leader, 65536)
            except OSError:  # the process closed the terminal
                return True
        return b"1/3" in shown

    try:
        wait_for(read_some, "the bar showing 1 of 3 rows drafted")
        assert b"drafting" in shown
        fake.release.set()
        process.wait(timeout=60)
    finally:
        os.close(leader)
    assert process.returncode == 0

    fake.release.clear()
    fake.answer_limit = None
    ws.reset()
    piped = ws.invoke("send", str(batch(ws, 3)), "--compose", str(brief(ws)))  # no terminal
    assert piped.exit_code == 0, piped.output
    assert "drafting" not in piped.stderr and "\x1b[" not in piped.stderr
