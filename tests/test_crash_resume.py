"""A crash at every crash point (items 1, 20 and 100 of the example batch), then `resume`:
every notification is delivered exactly once, an item crashed after its send is settled by
its receipt before the next item starts, and a crash point that could never fire is refused
before anything is stored."""

from __future__ import annotations

import pytest

from notifier.crash import POINTS

from .conftest import EXAMPLE, Workspace

pytestmark = pytest.mark.both_stores


def assert_exactly_once(ws: Workspace, total: int = 100) -> None:
    """Every item is in the outbox exactly once, under its own key, with its own digest."""
    documents = ws.outbox_documents()
    assert len(documents) == total
    stored = dict(ws.query("SELECT idempotency_key, intent_digest FROM items"))
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
    before = {r[0]: r[1] for r in ws.query("SELECT seq, state FROM items")}
    expected_state = "sent" if point == "after-receipt" else "in_flight"
    assert before[seq] == expected_state
    assert all(before[s] == "pending" for s in before if s > seq)

    resumed = ws.run("resume")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert_exactly_once(ws)


def test_after_send_20_is_found_by_query_and_settled_before_21(ws: Workspace) -> None:
    """Item 20 committed but unrecorded: resume finds its receipt, does not re-send it, and
    settles it before item 21's first attempt starts."""
    crashed = ws.run("send", str(EXAMPLE), env={"NOTIFIER_CRASH_AT": "after-send:20"})
    assert crashed.returncode == 137
    key = ws.query("SELECT idempotency_key FROM items WHERE seq = 20")[0][0]
    written_at = [d["written_at"] for d in ws.outbox_documents() if d["idempotency_key"] == key]
    assert len(written_at) == 1

    resumed = ws.run("resume")
    assert resumed.returncode == 0, resumed.stderr
    line = next(x for x in resumed.stdout.splitlines() if "item 20 " in x)
    assert key in line and "receipt found" in line and "not sent again" in line

    # The outbox file was not rewritten: same document, same write time.
    again = [d["written_at"] for d in ws.outbox_documents() if d["idempotency_key"] == key]
    assert again == written_at
    attempts_20 = ws.query("SELECT n, outcome FROM attempts WHERE seq = 20 ORDER BY n")
    assert attempts_20 == [(1, "interrupted")]
    settled_at = ws.query(
        "SELECT recorded_at, source FROM receipts WHERE idempotency_key = ?", (key,)
    )[0]
    assert settled_at[1] == "query"
    first_21 = ws.query("SELECT MIN(started_at) FROM attempts WHERE seq = 21")[0][0]
    assert first_21 > settled_at[0]
    assert_exactly_once(ws)


def test_after_intent_item_is_sent_again_with_the_same_key(ws: Workspace) -> None:
    """Nothing left before the crash: the query finds nothing, the item goes out once, under
    the key planned for it."""
    assert (
        ws.run("send", str(EXAMPLE), env={"NOTIFIER_CRASH_AT": "after-intent:20"}).returncode == 137
    )
    key = ws.query("SELECT idempotency_key FROM items WHERE seq = 20")[0][0]
    assert key not in {d["idempotency_key"] for d in ws.outbox_documents()}
    resumed = ws.run("resume")
    assert resumed.returncode == 0
    assert "not found" in resumed.stdout and key in resumed.stdout
    assert ws.query("SELECT n, outcome FROM attempts WHERE seq = 20 ORDER BY n") == [
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
    final = ws.run("resume")
    assert final.returncode == 0, final.stderr
    assert_exactly_once(ws)
    events = ws.query("SELECT seq_no FROM events ORDER BY seq_no")
    assert [e[0] for e in events] == list(range(1, len(events) + 1))


def test_resume_with_nothing_to_resume_says_so(ws: Workspace) -> None:
    """`resume` after a completed run exits 2 with a clear message."""
    assert ws.invoke("send", str(EXAMPLE)).exit_code == 0
    result = ws.invoke("resume")
    assert result.exit_code == 2
    assert "no unfinished run" in result.output


def test_bad_crash_spec_is_a_usage_error_before_anything_is_stored(ws: Workspace) -> None:
    """A mistyped NOTIFIER_CRASH_AT stops `send` with exit 2 and no database."""
    result = ws.run("send", str(EXAMPLE), env={"NOTIFIER_CRASH_AT": "after-sned:20"})
    assert result.returncode == 2
    assert "after-send" in result.stderr
    assert not ws.has_database()


def test_a_crash_point_beyond_the_batch_is_refused_before_anything_is_stored(
    ws: Workspace,
) -> None:
    """after-send:500 on a 100-row batch would never fire, and the rehearsal would look
    passed: exit 2 naming the range, nothing stored, nothing sent."""
    result = ws.run("send", str(EXAMPLE), env={"NOTIFIER_CRASH_AT": "after-send:500"})
    assert result.returncode == 2, result.stdout + result.stderr
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
    in_flight = [s for (s,) in ws.query("SELECT seq FROM items WHERE state = 'in_flight'")]
    if point != "after-receipt":
        assert 20 in in_flight and 8 <= len(in_flight) <= 32
    resumed = ws.run("resume")
    assert resumed.returncode == 0, resumed.stderr
    settled_lines = [line for line in resumed.stdout.splitlines() if line.startswith("item ")]
    assert len(settled_lines) == len(in_flight)
    first_new = ws.query(
        "SELECT MIN(started_at) FROM attempts WHERE seq > ?", (max(in_flight, default=0),)
    )[0][0]
    last_settled = ws.query("SELECT MAX(finished_at) FROM attempts WHERE outcome = 'interrupted'")[
        0
    ][0]
    if in_flight:
        assert first_new > last_settled
    assert_exactly_once(ws)
