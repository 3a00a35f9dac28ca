"""With --log-format json every recorded outcome of an item is an `outcome` event, with the
same fields whatever recorded it: the answer to a send, a status query's finding (at
resume, at the runner's revisit), or its deadline; and a process that ends on a lost lease
logs an ending event as any other ending does. Read from the JSON lines of real runs."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from notifier.domain import clock

from ..conftest import Workspace, make_rows
from ..receiver import Receiver, receiving, webhook_config
from ..support.background import meanwhile
from ..support.crashed import crash_invoke

# What an item's event carries (tests/cli/test_observe.py), and an outcome event besides.
ITEM_FIELDS = {"ts", "event", "run_id", "seq", "item", "key", "channel", "attempt"}


def json_lines(stderr: str) -> list[dict[str, Any]]:
    """Every stderr line as JSON (one that does not parse fails the test)."""
    return [json.loads(line) for line in stderr.splitlines()]


def outcomes(events: list[dict[str, Any]]) -> dict[int, list[str]]:
    """Each item's outcome events, in order, by seq; each with every item field."""
    by_seq: dict[int, list[str]] = {}
    for event in events:
        if event["event"] == "outcome":
            assert event.keys() >= ITEM_FIELDS, event
            by_seq.setdefault(event["seq"], []).append(event["outcome"])
    return by_seq


@pytest.mark.both_stores
@pytest.mark.timeout(90)
def test_a_settlement_at_resume_and_an_expiry_are_outcome_events(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A send is killed right after item 2's request was answered (its outcome not
    recorded); the resume, an hour later by its clock, settles item 2 by query (found in
    the outbox) and expires items 3 and 4 (past their not_after): each is an `outcome`
    event with the item's fields, as the sends of items 5 and 6 are."""
    soon = (datetime.now(UTC) + timedelta(seconds=1800)).isoformat(timespec="seconds")
    rows = [["id", "to", "subject", "body", "not_after"]]
    for i, deadline in enumerate(["", "", soon, soon, "", ""], start=1):
        rows.append([f"u{i}", f"user{i}@example.com", f"S{i}", f"B{i}", deadline])
    batch = ws.write_csv("b.csv", rows)
    crash_invoke(ws, "after-send:2", "send", str(batch))
    # In-process, its clock an hour on (what clock.SHIFT_ENV sets for a process).
    monkeypatch.setattr(clock, "_SHIFT", timedelta(seconds=3600))
    resumed = ws.invoke("resume", "--log-format", "json")
    assert resumed.exit_code == 3, resumed.output  # two expired
    events = json_lines(resumed.stderr)
    assert outcomes(events) == {2: ["found"], 3: ["expire"], 4: ["expire"], 5: ["ack"], 6: ["ack"]}
    assert events[-1]["event"] == "complete", events[-1]


@pytest.mark.both_stores
@pytest.mark.timeout(90)
def test_a_revisit_by_query_is_an_outcome_event(ws: Workspace) -> None:
    """Each request is answered 504 at once while the receiver commits it a moment later:
    the query right after finds nothing yet (too early to count), the item waits unknown,
    and the runner's revisit finds it. Both are `outcome` events: `lose`, then `found`."""
    receiver = Receiver(early="504", commit_after_s=0.5)
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(receiver, idempotent=False, status=True, timeout=1, query_delay=0.5)
        )
        ws.write_csv("batch.csv", make_rows(3))
        done = ws.invoke("send", "batch.csv", "--channel", "hooks", "--log-format", "json")
    assert done.exit_code == 0, done.output
    events = json_lines(done.stderr)
    assert outcomes(events) == {seq: ["lose", "found"] for seq in (1, 2, 3)}
    assert events[-1]["event"] == "complete", events[-1]


SLOW_S = 1.5  # how long the receiver takes over each request


@pytest.mark.both_stores
@pytest.mark.timeout(60)
def test_a_run_that_ends_on_a_lost_lease_logs_its_ending(ws: Workspace) -> None:
    """A `send` whose lease is taken over mid-run exits 4; its JSON log ends with a
    `lease_lost` event (state, stop, reason and counts, as any ending), before the
    command's `error` event."""
    receiver = Receiver(commit_delay_s=SLOW_S)
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            "[lease]\nttl = 30\n\n"
            + webhook_config(receiver, idempotent=False, status=True, timeout=10 * SLOW_S)
        )
        ws.write_csv("batch.csv", make_rows(20))

        def take_over() -> None:
            receiver.wait_for(lambda r: len(r.arrivals) >= 1)
            if ws.url:
                ws.forge.worker_leases_taken_over()
            else:
                ws.forge.run_lease_taken_over()

        # The send in-process, the takeover forged from a thread while it runs.
        with meanwhile(take_over):
            sender = ws.invoke("send", "batch.csv", "--channel", "hooks", "--log-format", "json")
    assert sender.exit_code == 4, sender.output
    events = json_lines(sender.stderr)
    names = [e["event"] for e in events]
    assert names[-2:] == ["lease_lost", "error"], names
    ending = events[-2]
    assert ending["stop"] == "lease_lost" and "took over" in ending["reason"], ending
    assert {"state", "counts"} <= ending.keys() and ending["counts"]["total"] == 20, ending
