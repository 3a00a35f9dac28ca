"""A crash at every crash point (items 1, 20 and 100 of the example batch), then `resume`:
every notification is delivered exactly once, an item crashed after its send is settled by
its receipt before the next item starts, and a crash point that could never fire is refused
before anything is stored."""

from __future__ import annotations

import pytest

from notifier.engine.crash import POINTS

from ..conftest import EXAMPLE, Workspace

pytestmark = pytest.mark.both_stores


def assert_exactly_once(ws: Workspace, total: int = 100) -> None:
    """Every item is in the outbox exactly once, under its own key, with its own digest."""
    documents = ws.outbox_documents()
    assert len(documents) == total
    stored = {i.idempotency_key: i.intent_digest for i in ws.ledger.items()}
    assert len(stored) == total
    assert {d["idempotency_key"]: d["intent_digest"] for d in documents} == stored
    assert ws.status()["counts"]["sent"] == total


@pytest.mark.parametrize("seq", [1, 20, 100])
@pytest.mark.parametrize("point", POINTS)
def test_crash_then_resume_sends_each_notification_once(
    ws: Workspace, point: str, seq: int
) -> None:
    """A crash at any point for any item, then `resume`, delivers all 100 exactly once."""
    crashed = ws.run("send", str(EXAMPLE), env={"NOTIFIER_CRASH_AT": f"{point}:{seq}"})
    assert crashed.returncode == 137, crashed.stderr
    assert f"{point}" in crashed.stderr and f"item {seq}" in crashed.stderr
    before = {i.seq: i.state for i in ws.ledger.items()}
    expected_state = "sent" if point == "after-receipt" else "in_flight"
    assert before[seq] == expected_state
    assert all(before[s] == "pending" for s in before if s > seq)

    resumed = ws.invoke("resume")
    assert resumed.exit_code == 0, resumed.output
    assert_exactly_once(ws)


def test_after_send_20_is_found_by_query_and_settled_before_21(ws: Workspace) -> None:
    """Item 20 committed but unrecorded: resume finds its receipt, does not re-send it, and
    settles it before item 21's first attempt starts."""
    crashed = ws.run("send", str(EXAMPLE), env={"NOTIFIER_CRASH_AT": "after-send:20"})
    assert crashed.returncode == 137
    key = ws.ledger.items()[19].idempotency_key  # seq 20
    written_at = [d["written_at"] for d in ws.outbox_documents() if d["idempotency_key"] == key]
    assert len(written_at) == 1

    resumed = ws.invoke("resume")
    assert resumed.exit_code == 0, resumed.output
    line = next(x for x in resumed.stdout.splitlines() if "item 20 " in x)
    assert key in line and "receipt found" in line and "not sent again" in line

    # The outbox file was not rewritten: same document, same write time.
    again = [d["written_at"] for d in ws.outbox_documents() if d["idempotency_key"] == key]
    assert again == written_at
    assert [(a.n, a.outcome) for a in ws.ledger.attempts(20)] == [(1, "interrupted")]
    receipt = ws.ledger.receipts()[key]
    assert receipt["source"] == "query"
    first_21 = min(a.started_at for a in ws.ledger.attempts(21))
    assert first_21 > receipt["recorded_at"]
    assert_exactly_once(ws)


def test_after_intent_item_is_sent_again_with_the_same_key(ws: Workspace) -> None:
    """Nothing left before the crash: the query finds nothing, the item goes out once, under
    the key planned for it."""
    assert (
        ws.run("send", str(EXAMPLE), env={"NOTIFIER_CRASH_AT": "after-intent:20"}).returncode == 137
    )
    key = ws.ledger.items()[19].idempotency_key  # seq 20
    assert key not in {d["idempotency_key"] for d in ws.outbox_documents()}
    resumed = ws.invoke("resume")
    assert resumed.exit_code == 0, resumed.output
    assert "not found" in resumed.stdout and key in resumed.stdout
    assert [(a.n, a.outcome) for a in ws.ledger.attempts(20)] == [
        (1, "interrupted"),
        (2, "sent"),
    ]
    assert_exactly_once(ws)


def test_crash_resume_crash_again_resume(ws: Workspace) -> None:
    """Two crashes at different points in one run still deliver each notification once."""
    assert (
        ws.run("send", str(EXAMPLE), env={"NOTIFIER_CRASH_AT": "after-send:20"}).returncode == 137
    )
    second = ws.run("resume", env={"NOTIFIER_CRASH_AT": "after-intent:57"})
    assert second.returncode == 137
    third = ws.run("resume", env={"NOTIFIER_CRASH_AT": "after-receipt:80"})
    assert third.returncode == 137
    final = ws.invoke("resume")
    assert final.exit_code == 0, final.output
    assert_exactly_once(ws)
    numbers = ws.ledger.event_numbers()
    assert numbers == list(range(1, len(numbers) + 1))


def test_resume_with_nothing_to_resume_says_so(ws: Workspace) -> None:
    """`resume` after a completed run exits 2 with a clear message."""
    assert ws.invoke("send", str(EXAMPLE)).exit_code == 0
    result = ws.invoke("resume")
    assert result.exit_code == 2
    assert "no unfinished run" in result.output


def test_bad_crash_spec_is_a_usage_error_before_anything_is_stored(ws: Workspace) -> None:
    """A mistyped NOTIFIER_CRASH_AT stops `send` with exit 2 and no database."""
    # In-process: a spec that could fire would end this process, but a refused one is
    # refused before anything runs, which is what is pinned.
    result = ws.invoke("send", str(EXAMPLE), env={"NOTIFIER_CRASH_AT": "after-sned:20"})
    assert result.exit_code == 2, result.output
    assert "after-send" in result.stderr
    assert not ws.has_database()


def test_a_crash_point_beyond_the_batch_is_refused_before_anything_is_stored(
    ws: Workspace,
) -> None:
    """after-send:500 on a 100-row batch would never fire, and the rehearsal would look
    passed: exit 2 naming the range, nothing stored, nothing sent."""
    result = ws.invoke("send", str(EXAMPLE), env={"NOTIFIER_CRASH_AT": "after-send:500"})
    assert result.exit_code == 2, result.output
    assert "cannot fire" in result.stderr and "from 1 to 100" in result.stderr
    assert not ws.has_database()
    assert ws.outbox_documents() == []


@pytest.mark.parametrize("point", POINTS)
def test_crash_with_a_window_of_8_settles_the_whole_window(ws: Workspace, point: str) -> None:
    """With --concurrency 8 a crash can leave 8 sends and, the outbox being queryable, up to
    24 more claimed ahead in flight: resume settles every one of them before anything new
    starts, and each notification is still delivered once."""
    crashed = ws.run(
        "send", str(EXAMPLE), "--concurrency", "8", env={"NOTIFIER_CRASH_AT": f"{point}:20"}
    )
    assert crashed.returncode == 137
    in_flight = [i.seq for i in ws.ledger.items() if i.state == "in_flight"]
    if point != "after-receipt":
        assert 20 in in_flight and 8 <= len(in_flight) <= 32
    resumed = ws.invoke("resume")
    assert resumed.exit_code == 0, resumed.output
    settled_lines = [line for line in resumed.stdout.splitlines() if line.startswith("item ")]
    assert len(settled_lines) == len(in_flight)
    if in_flight:
        attempts = ws.ledger.attempts()
        first_new = min(a.started_at for a in attempts if a.seq > max(in_flight))
        last_settled = max(str(a.finished_at) for a in attempts if a.outcome == "interrupted")
        assert first_new > last_settled
    assert_exactly_once(ws)
