"""Replaying a run's events through the state machines rebuilds exactly the items,
attempts, receipts, manual decisions and run state that are stored, after whatever the run
went through: random answers at concurrency 1 and 8 (a property test through the scripted
receiver), a crash at every point of the rehearsal and the resume after it, a cancel with its
report, manual reconciliation (sent, not sent and abandoned, then resumed), and a rejection by
the reviewer. Both stores; the chain holds under the key throughout."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from notifier.api import Notifier
from notifier.channels.scripted import (
    DELIVER,
    LOST_AFTER_COMMIT,
    LOST_BEFORE_COMMIT,
    REFUSE,
    REJECT,
    Channels,
    Response,
    throttle,
)
from notifier.domain.chain import KEY_ENV
from notifier.domain.intent import Intent
from notifier.domain.verify import AuditVerdict
from notifier.engine.crash import POINTS

from ..conftest import Workspace, make_rows
from ..support.audited import KEY, TOML, config, keyed, send, verdict
from ..support.waits import past_every_window

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(300)]
ANSWERS = (DELIVER, LOST_AFTER_COMMIT, LOST_BEFORE_COMMIT, throttle(0.01), REFUSE, REJECT)


def holds(ws: Workspace, run_id: str) -> None:
    found = verdict(ws, run_id)
    assert (found.verdict, found.findings) == (AuditVerdict.KEYED, ()), found


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    answers=st.lists(st.sampled_from(ANSWERS), min_size=1, max_size=10),
    later=st.sampled_from((DELIVER, LOST_AFTER_COMMIT, REFUSE)),
    concurrency=st.sampled_from((1, 8)),
)
def test_replay_equals_the_stored_state_after_random_answers(
    ws: Workspace,
    monkeypatch: pytest.MonkeyPatch,
    answers: list[Response],
    later: Response,
    concurrency: int,
) -> None:
    """Each item's first answer drawn, every later one `later`: whatever state the run
    ends in (completed, paused with unknowns, halted), its replay is its rows."""
    keyed(monkeypatch)
    n = next(_examples)

    def script(intent: Intent, tries: int) -> Response:
        return answers[intent.seq - 1] if tries == 0 else later

    run_id = f"random-{n}"
    send(ws, run_id, len(answers), script, start=n * 100, concurrency=concurrency)
    holds(ws, run_id)


_examples = itertools.count(1)


@pytest.mark.parametrize("point", POINTS)
def test_replay_equals_the_stored_state_after_a_crash_and_after_the_resume(
    ws: Workspace, point: str
) -> None:
    """Killed at `point` of item 3 (a real process, status 137): what it committed replays
    to its rows, and so does the run once `resume` (in this process) has finished it."""
    ws.write_csv("batch.csv", make_rows(6))
    key = {KEY_ENV: KEY}
    crashed = ws.run("send", "batch.csv", "--run-id", "crashed",
                     env={**key, "NOTIFIER_CRASH_AT": f"{point}:3"})  # fmt: skip
    assert crashed.returncode == 137, crashed.stderr
    holds(ws, "crashed")
    resumed = ws.invoke("resume", "crashed", env=key)  # in-process: the killed holder is gone
    assert resumed.exit_code == 0, resumed.output
    holds(ws, "crashed")


def test_replay_equals_the_stored_state_after_a_cancel_with_its_report(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run killed after item 3 was sent, then cancelled with `--report`: the cancel
    settles the item in flight and leaves the rest, and replays to what it wrote."""
    ws.write_csv("batch.csv", make_rows(6))
    crashed = ws.run("send", "batch.csv", "--run-id", "cancelled",
                     env={KEY_ENV: KEY, "NOTIFIER_CRASH_AT": "after-send:3"})  # fmt: skip
    assert crashed.returncode == 137, crashed.stderr
    keyed(monkeypatch)
    cancelled = ws.invoke("cancel", "cancelled", "--report")
    assert cancelled.exit_code in (0, 3), cancelled.output
    assert ws.ledger.run("cancelled").state == "cancelled"
    holds(ws, "cancelled")


def test_replay_equals_the_stored_state_after_manual_reconciliation(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """u2, u3 and u4 lost their answers (unknown); marked sent, not sent and abandoned by
    hand, then u4 marked not sent after all (its last error rewritten, no move): each
    decision replays (operator, evidence, receipt, last error), and so does the resume that
    sends u3 again."""
    keyed(monkeypatch)

    def lose(intent: Intent, tries: int) -> Response:
        return LOST_AFTER_COMMIT if intent.seq in (2, 3, 4) and tries == 0 else DELIVER

    _, channel = send(ws, "manual", 6, lose)
    (ws.path / "notifier.toml").write_text(TOML)
    past_every_window(monkeypatch)  # a not-sent mark waits out the receiver's window
    marks = (("u2", "sent"), ("u3", "not-sent"), ("u4", "abandon"), ("u4", "not-sent"))
    for item, mark in marks:
        evidence = f"relay log for {item}"
        decided = ws.invoke("reconcile", "manual", "--manual", "--item", item, "--mark", mark,
                            "--evidence", evidence, env={"USER": "carol"})  # fmt: skip
        assert decided.exit_code in (0, 3), decided.output
    holds(ws, "manual")
    assert len(ws.ledger.decisions("manual")) == 4
    assert ws.ledger.item("u4", "manual").last_error == "marked not sent by carol: relay log for u4"
    notifier = Notifier.open(ws.db, config=config(), channels=Channels(hooks=channel))
    notifier.work("manual")
    assert ws.ledger.item("u3", "manual").state == "sent"
    holds(ws, "manual")


def test_replay_equals_the_stored_state_after_a_rejection(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run planned for approval and rejected by its reviewer: the rejection closes it,
    cancelled, with nothing sent, and the chain and the replay hold under the key; a
    `resume` after it is refused and writes nothing that would break them."""
    keyed(monkeypatch)
    (ws.path / "notifier.toml").write_text(TOML)
    ws.write_csv("batch.csv", make_rows(4))
    planned = ws.invoke("send", "batch.csv", "--channel", "hooks", "--run-id", "rejected",
                        "--require-approval")  # fmt: skip
    assert planned.exit_code == 0, planned.output
    holds(ws, "rejected")
    rejected = ws.invoke("reject", "rejected", "--reason", "wrong audience",
                         env={"USER": "carol"})  # fmt: skip
    assert rejected.exit_code == 0, rejected.output
    assert ws.ledger.run("rejected").state == "cancelled"
    holds(ws, "rejected")
    assert ws.invoke("resume", "rejected").exit_code == 2
    assert ws.ledger.receipt_count() == 0
    holds(ws, "rejected")
