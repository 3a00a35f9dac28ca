"""A halting answer (410, 422) or the uncertain-answers brake stops every send not yet
started at once, before the committer has judged the answers: no queued item starts after
a halting answer; at the unknown-streak limit (5) exactly N + 4 requests leave, the
committer halts at the fifth unknown outcome, and while the status queries of those answers
are under way it waits for them rather than claim and release items over and over.

The in-process tests run the real Runner at N = 8 with items claimed ahead, against a
channel whose requests wait until the test answers them, and hold the committer on the
first answer it takes up (before judging it) until every queued item has gone through a
sender: what stops a queued item there is the senders' own check, nothing the committer
did. The last runs the real CLI against a receiver on 127.0.0.1 (tests/receiver.py). All on
both stores."""

from __future__ import annotations

from functools import partial

import pytest

from notifier.domain.answers import ChannelError, ErrorKind, Receipt
from notifier.domain.records import AttemptOutcome, Outcome
from notifier.domain.state_machine import ItemTrigger
from notifier.engine.brakes import Brakes
from notifier.engine.judging import NotStarted, Progress
from notifier.engine.run_control import Stop
from notifier.engine.runner import RunOptions

from ..conftest import Workspace, make_rows, wait_for
from ..receiver import WAIT_S as RECEIVER_WAIT_S
from ..receiver import Receiver, receiving, webhook_config
from ..support.held import WAIT_S, Answered, HeldRun


@pytest.mark.both_stores
@pytest.mark.parametrize(
    ("kind", "stop"), [(ErrorKind.GONE, Stop.HALTED), (ErrorKind.CONFLICT, Stop.CONFLICT)]
)
@pytest.mark.timeout(60)
def test_no_queued_item_starts_after_a_halting_answer(
    ws: Workspace, kind: ErrorKind, stop: Stop
) -> None:
    """At N = 8 with 3N claimed ahead: a 410 (or 422) arrives while the other N - 1
    requests are under way; the senders then free up and find the 3N queued items, the
    committer not having judged the answer yet: no request starts after the halting answer
    was given (every sender was busy when it came, so none had a check passed before it),
    and every queued item is released never attempted."""
    n = 8

    def answer(item: str) -> Receipt | ChannelError:
        if item == "1":
            return ChannelError(kind, f"scripted {kind.value}")
        return Receipt("r-" + item)

    channel = Answered(answer=answer)
    run = HeldRun(ws, channel, n, 4 * n)
    run.thread.start()
    try:
        channel.wait_started(n)
        channel.let_go("1")
        assert run.held.reached.wait(WAIT_S), "the halting answer never reached the committer"
        channel.let_all_go()
        run.wait_taken(4 * n)
    finally:
        result = run.finish(channel)
    halted_at = channel.answered["1"]
    assert [item for item, at in channel.started if at > halted_at] == []
    assert len(channel.started) == n
    assert sum(isinstance(r, NotStarted) for r in run.taken) == 3 * n
    assert result.stop is stop, result
    never = [i for i in ws.ledger.items() if i.state == "pending" and i.attempts == 0]
    assert len(never) == 3 * n


def _took_next(run: HeldRun, channel: Answered, n: int, k: int) -> bool:
    """Whether the first `k` answers were taken up, and each of their senders took its next
    job: a start (waiting on the test) or a job held back."""
    return len(run.taken) + len(channel.started) - n >= 2 * k


@pytest.mark.both_stores
@pytest.mark.timeout(60)
def test_the_uncertain_answers_brake_holds_at_exactly_the_streak_limit(ws: Workspace) -> None:
    """At N = 8 with 3N claimed ahead on a channel that cannot dedupe (its status queries
    find each delivery), the committer held on the first answer: the N requests under way
    answer uncertain one at a time, and each sender that frees up takes a queued item.
    While fewer than the limit (5) answers are uncertain it starts it; at the limit it does
    not. So exactly N + 4 requests leave: one after each of the first four answers, none
    after the fifth and later."""
    n = 8
    channel = Answered(
        idempotent=False,
        holds=True,
        answer=lambda item: ChannelError(ErrorKind.UNCERTAIN, "timed out after sending"),
    )
    run = HeldRun(ws, channel, n, 4 * n)
    run.thread.start()
    try:
        channel.wait_started(n)
        first = [item for item, _ in channel.started[:n]]
        for k, item in enumerate(first, start=1):
            channel.let_go(item)
            wait_for(partial(_took_next, run, channel, n, k), f"sender {k}'s next job", WAIT_S)
        started = len(channel.started)
    finally:
        result = run.finish(channel)
    limit = RunOptions().unknown_streak_limit
    assert limit == 5
    assert started == n + limit - 1
    assert result.stop is Stop.COMPLETED, result  # each query found its delivery


def test_the_committer_halts_at_exactly_the_streak_limit_of_unknowns() -> None:
    """The committer's side of the same brake: four unknown outcomes in a row neither halt
    the run nor are read ahead as halting it (so a commit still claims new items); the
    fifth does both."""
    progress = Progress(say=lambda line: None)
    brakes = Brakes(progress, streak_limit=5, down_after=3)
    lost = [
        Outcome(seq, ItemTrigger.LOSE, AttemptOutcome.UNCERTAIN, error="timed out")
        for seq in range(1, 6)
    ]
    channel_of = {outcome.seq: "hooks" for outcome in lost}
    assert not brakes.would_halt(lost[:4], channel_of)
    assert brakes.would_halt(lost, channel_of)
    assert [brakes.after(outcome) for outcome in lost[:4]] == [None] * 4
    brake = brakes.after(lost[4])
    assert brake is not None and brake.cause is Stop.HALTED


ROWS = 40
N = 8

# As many uncertain answers as the unknown-streak limit (RunOptions: 5): the senders' brake
# (Dispatch.may_start) holds every other send back until the committer has judged them.
UNCERTAIN = {f"u{i}" for i in range(1, 6)}


def _not_started(ws: Workspace) -> int:
    """Attempts closed as `not_started`: claimed, held back by a sender, released."""
    return len([a for a in ws.ledger.attempts() if a.outcome == "not_started"])


@pytest.mark.both_stores
@pytest.mark.timeout(120)
def test_queries_holding_the_brake_do_not_spin_the_committer(ws: Workspace) -> None:
    """At N = 8, five uncertain answers (the streak limit) whose status queries take 2 s each
    on their senders hold every other send back: the committer waits for them, it does not
    claim and release the held items over and over (one commit and one `not_started` attempt
    row each, thousands a second)."""
    receiver = Receiver(
        # The five are committed, their answer lost (500): found by the query. Every other
        # item is refused (400), so no receipt resets the senders' count of doubts.
        answer=lambda item, nth: 500 if item in UNCERTAIN else 400,
        commit_first=True,
        query_delay_s=2.0,  # the receiver's own slowness: each query answers after 2 s
    )
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(receiver, idempotent=False, status=True, timeout=RECEIVER_WAIT_S)
        )
        ws.write_csv("batch.csv", make_rows(ROWS))
        done = ws.invoke("send", "batch.csv", "--channel", "hooks", "--concurrency", str(N))
    assert "completed" in done.stdout, done.output
    counts = ws.status()["counts"]
    assert (counts["sent"], counts["failed"]) == (len(UNCERTAIN), ROWS - len(UNCERTAIN))
    assert all(receiver.posts(item) == 1 for item in UNCERTAIN)
    # An item claimed ahead may be held back by the brake once or twice (as the brake
    # engages, and once more before its answers are judged), not thousands of times.
    assert _not_started(ws) <= 2 * ROWS, f"{_not_started(ws)} attempts released unstarted"
