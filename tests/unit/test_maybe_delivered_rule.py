"""One rule says whether an item may have reached its recipient: an attempt whose outcome
proves nothing about delivery (records.MAYBE_DELIVERED_OUTCOMES), not disproved later by a
query's `not_found` or an operator's `mark_not_sent`. The decision reads it in Python
(evidence.History.maybe_delivered); expiry, cancel, suppression and the report read it in
SQL (statements.MAYBE_DELIVERED). Both are generated from the one constant, and agree for
every outcome an attempt can be stored with, on both stores."""

from __future__ import annotations

import pytest
import tenacity

from notifier.domain.answers import ChannelError, ErrorKind
from notifier.domain.decide import AfterSend, Caps, History, decide
from notifier.domain.records import (
    MAYBE_DELIVERED_OUTCOMES,
    NEVER_REACHED,
    AttemptOutcome,
    Outcome,
    PendingKind,
)
from notifier.domain.retry import RetryPolicy
from notifier.domain.state_machine import ItemState, ItemTrigger
from notifier.engine.membership import holder_alive
from notifier.store import Store

from ..conftest import Workspace, make_rows
from ..support.runs import plan_run
from .test_decide import NOW, _attempt, _item

BLIND = Caps(idempotent=False, queryable=False)  # a webhook without status_url
ONCE = RetryPolicy(max_attempts=1, deadline_s=900, backoff=tenacity.wait_fixed(1))
TWICE = RetryPolicy(max_attempts=2, deadline_s=900, backoff=tenacity.wait_fixed(1))
_OWNER = {"host": "elsewhere", "pid": 1, "started": None, "token": "rule"}


def test_every_error_kind_is_an_attempt_outcome() -> None:
    """An answer's class is stored as the attempt's outcome: each has its enum member."""
    assert {k.value for k in ErrorKind} <= {o.value for o in AttemptOutcome}


def test_maybe_delivered_outcomes_may_all_have_reached_the_receiver() -> None:
    """What may have been delivered may have reached the receiver (the query window and a
    replay's check read NEVER_REACHED's complement)."""
    assert not MAYBE_DELIVERED_OUTCOMES & NEVER_REACHED


def test_a_409_in_progress_that_spends_the_attempts_is_unknown_not_failed() -> None:
    """A 409 says the first request under this key is still being processed: it may be
    delivered. With the attempts spent on a channel that can be neither asked nor trusted
    to dedupe, the item is unknown, never `failed` (a failed row is sent again by a later
    send of its file)."""
    decision = decide(
        _item(1),
        AfterSend(ChannelError(ErrorKind.IN_PROGRESS, "409 in progress")),
        caps=BLIND,
        policy=ONCE,
        history=History((_attempt(1, None),)),
        now=NOW,
    )
    assert decision.outcome is not None
    assert decision.outcome.trigger is ItemTrigger.LOSE, decision.outcome


def test_an_earlier_409_keeps_an_exhausted_item_unknown() -> None:
    """An earlier attempt answered 409 in progress may have been delivered: a later refusal
    that spends the attempts leaves the item unknown, as an earlier timeout does."""
    decision = decide(
        _item(2),
        AfterSend(ChannelError(ErrorKind.NOT_SENT, "refused")),
        caps=BLIND,
        policy=TWICE,
        history=History((_attempt(1, "in_progress", 2), _attempt(2, None))),
        now=NOW,
    )
    assert decision.outcome is not None
    assert decision.outcome.trigger is ItemTrigger.LOSE, decision.outcome


@pytest.mark.both_stores
@pytest.mark.timeout(120)
def test_the_python_rule_and_the_sql_rule_agree_for_every_outcome(ws: Workspace) -> None:
    """Each item of a run gets one attempt closed with one outcome (every AttemptOutcome),
    half of them disproved afterwards by a `not_found`; then the Python predicate over the
    stored attempts and every SQL reading of the rule (the report's pending kinds, the
    deadline's and the suppression's checks, expiry) give the same items."""
    outcomes = list(AttemptOutcome)
    cases = [(o, disproved) for o in outcomes for disproved in (False, True)]
    rows = make_rows(len(cases))
    # A deadline on every row, for the expiry's reading of the rule (due at a later `at`).
    rows = [[*rows[0], "not_after"]] + [[*row, "2030-01-01T00:00:00Z"] for row in rows[1:]]
    run_id = plan_run(ws, rows)
    store = Store.open(ws.db)
    try:
        version = store.leases.acquire_lease(run_id, _OWNER, 30, holder_alive)
        claimed = store.ledger.claim(run_id, version, len(cases))
        assert [i.seq for i in claimed] == list(range(1, len(cases) + 1))
        closed = [
            Outcome(seq, ItemTrigger.RETRY_LATER, outcome, expected=ItemState.IN_FLIGHT)
            for seq, (outcome, _) in enumerate(cases, start=1)
        ]
        store.ledger.record(run_id, version, closed)
        disproofs = [
            Outcome(seq, ItemTrigger.NOT_FOUND, expected=ItemState.PENDING)
            for seq, (_, disproved) in enumerate(cases, start=1)
            if disproved
        ]
        store.ledger.record(run_id, version, disproofs)
        seqs = list(range(1, len(cases) + 1))
        python = {
            seq for seq in seqs if History.of(store.queries.attempts(run_id, seq)).maybe_delivered()
        }
        kinds = store.queries.pending_kinds(run_id)
        assert set(kinds) == set(seqs)
        by_kind = {s for s, k in kinds.items() if k is PendingKind.MAYBE_DELIVERED}
        among = store.queries.maybe_delivered(run_id, seqs)
        suppressions = store.suppressions._maybe_delivered(run_id, seqs)
        expirable = set(store.ledger._due_for_expiry(run_id, "2031-01-01T00:00:00Z"))
        expected = {
            seq
            for seq, (outcome, disproved) in enumerate(cases, start=1)
            if outcome in MAYBE_DELIVERED_OUTCOMES and not disproved
        }
        named = {seq: cases[seq - 1] for seq in seqs}
        assert {named[s] for s in python} == {named[s] for s in expected}
        assert by_kind == expected
        assert among == expected
        assert suppressions == expected
        assert expirable == set(seqs) - expected
        store.leases.release_lease(run_id, version)
    finally:
        store.close()
