"""`send --compose`: Claude drafts through the real `anthropic` SDK against a scripted fake
Messages API on 127.0.0.1; drafts are stored before any digest and never requested twice."""

from __future__ import annotations

import json
import re
import signal
import sqlite3
from collections import Counter, deque
from concurrent.futures import Future
from pathlib import Path

import pytest

from notifier.content import compose
from notifier.content.batch_csv import BatchRow
from notifier.content.compose import ComposeStopped, Draft
from notifier.domain import waits
from notifier.domain.intent import intent_digest

from ..conftest import Workspace
from ..fake_messages import KEY, FakeMessages, error, text_only_answer
from ..support.net import refusing_port


def batch(ws: Workspace, n: int) -> Path:
    rows = [["id", "to", "name", "plan"]]
    rows += [[f"u{i}", f"user{i}@example.com", f"User {i}", "pro"] for i in range(1, n + 1)]
    return ws.write_csv("b.csv", rows)


def brief(ws: Workspace) -> Path:
    path = ws.path / "brief.txt"
    path.write_text("Tell each customer their plan renews next week. Be brief.", "utf-8")
    return path


def drafted_rows(ws: Workspace) -> list[tuple[str]]:
    """The item ids drafted so far; none while the worker has not created the tables."""
    try:
        drafts = ws.ledger.drafts()
        return [(json.loads(d["source"])["item_id"],) for d in drafts if d["state"] == "drafted"]
    except sqlite3.OperationalError as exc:
        # Not there yet: no file, no tables in it, or being created (before WAL mode).
        if any(m in str(exc) for m in ("unable to open", "no such table", "is locked")):
            return []
        raise


def sigint_pending(pid: int) -> bool:
    """Whether SIGINT is still pending for `pid` (sent, not yet taken by its handler)."""
    bit = 1 << (signal.SIGINT - 1)
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    masks = [line.split()[1] for line in status if line.startswith(("SigPnd:", "ShdPnd:"))]
    return any(int(mask, 16) & bit for mask in masks)


def test_compose_drafts_every_row_through_a_forced_tool_and_stores_each_draft(
    ws: Workspace, fake: FakeMessages
) -> None:
    """Every row is drafted once through the SDK (tool schema subject/body, tool_choice
    forcing it, the env key); drafts are stored with model and tokens; the digest covers
    the drafted text; status shows progress and total tokens."""
    result = ws.invoke("send", str(batch(ws, 5)), "--compose", str(brief(ws)), "--model", "m-x")
    assert result.exit_code == 0, result.output
    assert sorted(fake.rows_requested()) == ["u1", "u2", "u3", "u4", "u5"]
    request = fake.requests[0]
    sent_key = request.headers.get("x-api-key") or request.headers.get("authorization", "")
    assert sent_key.removeprefix("Bearer ") == KEY
    assert request.body["model"] == "m-x"
    [tool] = request.body["tools"]
    assert set(tool["input_schema"]["properties"]) == {"subject", "body"}
    assert request.body["tool_choice"] == {"type": "tool", "name": tool["name"]}
    assert "renews next week" in request.body["system"]
    drafts = [
        (d["seq"], d["state"], d["model"], d["input_tokens"], d["output_tokens"])
        for d in ws.ledger.drafts()
    ]
    assert drafts == [(i, "drafted", "claude-test-1", 11, 7) for i in range(1, 6)]
    docs = {d["item_id"]: d for d in ws.outbox_documents()}
    assert docs["u3"]["subject"] == "Draft u3" and docs["u3"]["body"] == "Dear User 3, hello."
    for item in ws.ledger.items():
        payload = ws.ledger.payload(item.seq)
        assert intent_digest(item.channel, item.target, payload) == item.intent_digest
    status = ws.status()
    assert status["drafts"]["drafted"] == 5 and status["drafts"]["input_tokens"] == 55
    assert status["drafts"]["output_tokens"] == 35
    assert KEY not in result.output and KEY not in ws.db_file.read_bytes().decode("latin-1")


def test_429_and_529_are_retried_honouring_retry_after(
    ws: Workspace, fake: FakeMessages, fast_waits: float
) -> None:
    """A 429 with retry-after: 1 is retried no sooner than that second (scaled by the test
    switch: the backoff alone, scaled too, stays under half of it); a 529 is retried; every
    row ends drafted and sent."""
    fake.per_row["u2"] = deque([error(429, "rate_limit_error", "slow down", {"retry-after": "1"})])
    fake.per_row["u3"] = deque([error(529, "overloaded_error", "overloaded")])
    result = ws.invoke("send", str(batch(ws, 3)), "--compose", str(brief(ws)))
    assert result.exit_code == 0, result.output
    u2 = [r.at for r in fake.requests if r.row_id == "u2"]
    assert len(u2) == 2 and u2[1] - u2[0] >= 0.9 * waits.scaled(1)
    assert [r.row_id for r in fake.requests].count("u3") == 2
    assert len(ws.outbox_documents()) == 3


def test_a_malformed_tool_answer_fails_that_row_and_the_others_go_on(
    ws: Workspace, fake: FakeMessages
) -> None:
    """Prose instead of the tool call fails that row (not retried, never planned) with its
    error; the other rows are drafted and sent; the run needs attention (exit 3)."""
    fake.per_row["u2"] = deque([text_only_answer()])
    result = ws.invoke("send", str(batch(ws, 3)), "--compose", str(brief(ws)))
    assert result.exit_code == 3, result.output
    assert "line 3" in result.output and "malformed answer" in result.output
    assert [r.row_id for r in fake.requests].count("u2") == 1
    assert sorted(d["item_id"] for d in ws.outbox_documents()) == ["u1", "u3"]
    drafts = ws.status()["drafts"]
    assert drafts["failed"] == 1 and "no notification_draft tool call" in str(drafts["failures"])


def test_401_stops_every_row_with_a_clear_message_and_resume_continues(
    ws: Workspace, fake: FakeMessages
) -> None:
    """A 401 stops drafting for every row (exit 3) naming the key's variable, not its value;
    nothing is sent; once the key works, resume drafts and sends everything."""
    fake.script.extend(error(401, "authentication_error", "invalid x-api-key") for _ in range(4))
    result = ws.invoke("send", str(batch(ws, 4)), "--compose", str(brief(ws)))
    assert result.exit_code == 3, result.output
    assert "ANTHROPIC_API_KEY" in result.output and "401" in result.output
    assert KEY not in result.output
    assert "notifier resume" in result.output
    assert ws.outbox_documents() == []
    assert ws.ledger.items() == []
    assert len(fake.requests) <= 4  # no retry of a refused key
    fake.script.clear()
    resumed = ws.invoke("resume")
    assert resumed.exit_code == 0, resumed.output
    assert len(ws.outbox_documents()) == 4


def test_rows_cancelled_after_a_stop_are_skipped_not_an_internal_error() -> None:
    """When a 401 stops drafting while other rows still wait for a thread, those rows are
    cancelled and left undrafted: the stop is reported, never a CancelledError (a race that
    turned test_401 above into "internal error" on a busy machine)."""
    stopped: Future[Draft] = Future()
    stopped.set_exception(ComposeStopped("401: the key was refused"))
    waiting: Future[Draft] = Future()  # queued behind busy threads, not started
    # What the pool's worker does when it reaches a cancelled row: tell the waiters.
    waiting.add_done_callback(lambda future: future.set_running_or_notify_cancel())
    row = BatchRow(2, 1, "u1", "user1@example.com", "", "", "outbox", {})
    futures = {stopped: (1, row), waiting: (2, row)}

    class Idle:
        def draft(self, row: BatchRow) -> Draft:
            raise AssertionError("no request is made here")

        def stop(self) -> None:
            return

    storing = compose._Storing(None, "run-1", Idle(), futures, print, lambda n: None)  # type: ignore[arg-type]
    storing.run(None)
    assert storing.stopped is not None and "401" in str(storing.stopped)
    assert waiting.cancelled()


def test_a_missing_key_is_refused_before_anything_is_stored(
    ws: Workspace, fake: FakeMessages, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without ANTHROPIC_API_KEY: exit 2 naming the variable, no database, no request."""
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    result = ws.invoke("send", str(batch(ws, 2)), "--compose", str(brief(ws)))
    assert result.exit_code == 2, result.output
    assert "ANTHROPIC_API_KEY" in result.output
    assert not ws.db_file.exists() and fake.requests == []


def test_dry_run_compose_shows_the_first_drafts_and_stores_nothing(
    ws: Workspace, fake: FakeMessages
) -> None:
    """--dry-run --compose drafts and shows only the first few rows; nothing is stored."""
    result = ws.invoke("send", str(batch(ws, 6)), "--compose", str(brief(ws)), "--dry-run")
    assert result.exit_code == 0, result.output
    assert "subject: Draft u1" in result.output and "Draft u3" in result.output
    assert "u4" not in result.output and "nothing stored" in result.output
    assert sorted(fake.rows_requested()) == ["u1", "u2", "u3"]
    assert not ws.db_file.exists()


def test_compose_then_approval_then_resume_drafts_nothing_again(
    ws: Workspace, fake: FakeMessages
) -> None:
    """Compose + --require-approval stores the drafts and waits; approve; resume sends the
    approved drafts without a single new request."""
    result = ws.invoke("send", str(batch(ws, 3)), "--compose", str(brief(ws)), "--require-approval")
    assert result.exit_code == 0, result.output
    assert "subject: Draft u1" in result.output
    fingerprint = re.search(r"fingerprint: (sha256:[0-9a-f]+)", result.output)
    assert fingerprint is not None
    requests = len(fake.requests)
    assert ws.invoke("resume").exit_code == 4
    approved = ws.invoke("approve", "--fingerprint", fingerprint.group(1))
    assert approved.exit_code == 0, approved.output
    sent = ws.invoke("resume")
    assert sent.exit_code == 0, sent.output
    assert len(fake.requests) == requests
    assert sorted(d["subject"] for d in ws.outbox_documents()) == [
        "Draft u1",
        "Draft u2",
        "Draft u3",
    ]


def test_compose_with_a_template_renders_the_draft(ws: Workspace, fake: FakeMessages) -> None:
    """--compose with --template: the template sees `draft.subject` / `draft.body` and the
    row's columns; a template missing a column fails before any request (exit 2)."""
    tpl = ws.path / "t.toml"
    tpl.write_text(
        'subject = "[{{ plan }}] {{ draft.subject }}"\nbody = "{{ draft.body }}\\n-- ops"\n'
    )
    result = ws.invoke(
        "send", str(batch(ws, 2)), "--compose", str(brief(ws)), "--template", str(tpl)
    )
    assert result.exit_code == 0, result.output
    docs = {d["item_id"]: d for d in ws.outbox_documents()}
    assert docs["u1"]["subject"] == "[pro] Draft u1"
    assert docs["u2"]["body"] == "Dear User 2, hello.\n-- ops"

    bad = ws.path / "bad.toml"
    bad.write_text('subject = "{{ draft.subject }} {{ city }}"\nbody = "x"\n')
    before = len(fake.requests)
    refused = ws.invoke(
        "send", str(batch(ws, 2)), "--compose", str(brief(ws)), "--template", str(bad)
    )
    assert refused.exit_code == 2, refused.output
    assert "'city' is undefined" in refused.output and len(fake.requests) == before


@pytest.mark.both_stores
@pytest.mark.parametrize("with_ids", [True, False], ids=["ids", "no-ids"])
def test_a_composed_row_has_the_identity_of_its_source_row(
    ws: Workspace, fake: FakeMessages, with_ids: bool
) -> None:
    """A composed row is the same notification whatever is drafted for it: while another
    run holds it open, composing the file again is refused (exit 2) before any token is
    spent; once delivered, composing it again (or sending the file plainly) plans nothing,
    so each recipient gets it once."""
    rows = [["id", "to", "name"]] if with_ids else [["to", "name"]]
    for i in (1, 2, 3):
        rows.append([f"u{i}", f"user{i}@example.com", f"User {i}"][0 if with_ids else 1 :])
    ws.write_csv("d.csv", rows)
    held = ws.invoke("send", "d.csv", "--compose", str(brief(ws)), "--require-approval")
    assert held.exit_code == 0, held.output
    first_run = ws.ledger.run().run_id
    requests = len(fake.requests)
    again = ws.invoke("send", "d.csv", "--compose", str(brief(ws)), "--run-id", "comp2")
    assert again.exit_code == 2, again.output
    assert first_run in again.output and "still open" in again.output
    assert len(fake.requests) == requests  # refused before a token was spent
    fingerprint = re.search(r"fingerprint: (sha256:[0-9a-f]+)", held.output)
    assert fingerprint is not None
    assert ws.invoke("approve", "--fingerprint", fingerprint.group(1)).exit_code == 0
    assert ws.invoke("resume").exit_code == 0
    third = ws.invoke("send", "d.csv", "--compose", str(brief(ws)))
    assert third.exit_code == 0, third.output
    assert "nothing to send" in third.output and "3 row(s) already delivered" in third.output
    assert len(fake.requests) == requests
    # Sent as written, the rows would carry other text than the drafts delivered: refused
    # as changed rows are (exit 2), never sent again unasked.
    plain = ws.invoke("send", "d.csv")
    assert plain.exit_code == 2 and "different content" in plain.output, plain.output
    assert sorted(d["to"] for d in ws.outbox_documents()) == [
        "user1@example.com", "user2@example.com", "user3@example.com"
    ]  # fmt: skip
    assert [r.run_id for r in ws.ledger.runs()] == [first_run]


@pytest.mark.parametrize(
    ("answers", "said"),
    [
        (None, "could not be reached"),
        ([(429, "rate_limit_error")], "kept answering 429 (rate-limited)"),
        ([(500, "api_error")], "kept failing with a server error (5xx)"),
    ],
    ids=["unreachable", "rate-limited", "server-error"],
)
def test_drafting_that_gets_no_answer_says_why(
    ws: Workspace,
    fake: FakeMessages,
    fast_waits: float,
    monkeypatch: pytest.MonkeyPatch,
    answers: list[tuple[int, str]] | None,
    said: str,
) -> None:
    """When every retry of a row gets no draft, the run stops (exit 3, drafts kept) saying
    what happened: the API unreachable (a closed port), rate-limited, or failing; never a
    blanket "stayed busy"."""
    with refusing_port() as closed:
        if answers is None:
            monkeypatch.setenv("ANTHROPIC_BASE_URL", f"http://127.0.0.1:{closed}")
        else:
            fake.per_row["u1"] = deque(error(code, kind, "no") for code, kind in answers * 20)
        result = ws.invoke("send", str(batch(ws, 1)), "--compose", str(brief(ws)))
    assert result.exit_code == 3, result.output
    assert f"the Messages API {said}" in result.output
    assert "stayed busy" not in result.output


def test_compose_drafts_no_row_whose_recipient_is_suppressed(
    ws: Workspace, fake: FakeMessages
) -> None:
    """A row whose recipient is on the suppression list is left out before drafting: no
    token is spent on it, it is not sent, and the summary says so."""
    assert ws.invoke("suppress", "add", "user2@example.com").exit_code == 0
    result = ws.invoke("send", str(batch(ws, 3)), "--compose", str(brief(ws)))
    assert result.exit_code == 0, result.output
    assert sorted(fake.rows_requested()) == ["u1", "u3"]
    assert "1 row(s) left out: their recipient is on the suppression list" in result.output
    assert sorted(d["to"] for d in ws.outbox_documents()) == [
        "user1@example.com", "user3@example.com"
    ]  # fmt: skip


@pytest.mark.both_stores
def test_a_compose_run_frozen_later_sends_no_row_delivered_meanwhile(
    ws: Workspace, fake: FakeMessages
) -> None:
    """Drafting stops (a 401) and the operator sends the same file as written meanwhile,
    which delivers its rows (nothing holds them: the composed run has no intents yet). When
    the composed run is resumed and frozen, those rows are compared again, in the freeze's
    transaction, and failed as delivered by the other run: no recipient gets two."""
    fake.script.extend(error(401, "authentication_error", "invalid x-api-key") for _ in range(4))
    stopped = ws.invoke("send", str(batch(ws, 3)), "--compose", str(brief(ws)))
    assert stopped.exit_code == 3, stopped.output
    compose_run = ws.ledger.run().run_id
    plain = ws.invoke("send", str(ws.path / "b.csv"))
    assert plain.exit_code == 0, plain.output
    fake.script.clear()
    resumed = ws.invoke("resume", compose_run)
    assert resumed.exit_code == 3, resumed.output  # its rows failed: another run sent them
    per_recipient = Counter(d["to"] for d in ws.outbox_documents())
    assert sorted(per_recipient.values()) == [1, 1, 1], per_recipient
    reasons = [i.last_error for i in ws.ledger.items(compose_run)]
    assert all("delivered this row" in str(r) for r in reasons), reasons
