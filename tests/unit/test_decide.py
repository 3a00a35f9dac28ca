"""The one decision (notifier/domain/decide.py) as a table: what each answer, and each query's
finding, means for an item, at each moment it is decided (after a send, at resume, at the
runner's revisit, at cancel); and, as a property, that no decision makes a move the item
state machine forbids or retries blindly what may have been delivered. Pure: no store, no
clock, no channel."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import tenacity
from hypothesis import given, settings
from hypothesis import strategies as st

from notifier.domain import clock
from notifier.domain.answers import ChannelError, ErrorKind, Receipt
from notifier.domain.decide import (
    AfterSend,
    Answer,
    Caps,
    Decision,
    Finding,
    History,
    Moment,
    NotStarted,
    Sent,
    Settling,
    Unasked,
    decide,
    not_found_counts_from,
)
from notifier.domain.records import Attempt, AttemptOutcome, Item
from notifier.domain.retry import RetryPolicy
from notifier.domain.state_machine import IllegalMove, ItemState, ItemTrigger, item_next

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
DIGEST = "sha256:ours"
POLICY = RetryPolicy(max_attempts=3, deadline_s=900, backoff=tenacity.wait_fixed(1))
# A webhook that cannot dedupe but can be asked; one that dedupes and can be asked; SMTP.
ASKABLE = Caps(idempotent=False, queryable=True)
DEDUPES = Caps(idempotent=True, queryable=True)
BLIND = Caps(idempotent=False, queryable=False, suppress_on_reject=True)
DELAYED = replace(ASKABLE, query_delay_s=5.0, timeout_s=3.0)


def _item(attempts: int = 1, state: ItemState = ItemState.IN_FLIGHT, **changes: Any) -> Item:
    return Item(
        run_id="r1",
        seq=7,
        item_id="u7",
        channel="hooks",
        target="t",
        payload={},
        idempotency_key="k7",
        intent_digest=DIGEST,
        state=state,
        attempts=attempts,
        next_attempt_at=changes.pop("next_attempt_at", None),
        receipt_id=None,
        last_error=changes.pop("last_error", None),
    )


def _attempt(n: int, outcome: str | None, minutes_ago: float = 1.0) -> Attempt:
    at = clock.iso(NOW - timedelta(minutes=minutes_ago))
    finished = None if outcome is None else at
    stored = None if outcome is None else AttemptOutcome(outcome)
    return Attempt(7, n, at, finished, stored, None, None, None, None)


def _err(kind: ErrorKind, **kw: Any) -> ChannelError:
    return ChannelError(kind, f"{kind.value} answer", **kw)


FOUND = Answer(Finding.FOUND, Receipt("r-k7", DIGEST), "receipt found by query")
OTHER = Answer(Finding.CONFLICT, Receipt("r-k7", "sha256:theirs"), "another intent")
MISSING = Answer(Finding.NOT_FOUND, detail="nothing under this key")
UNSURE = Answer(Finding.UNCERTAIN, detail="query failed: 500")
LATER = NOW + timedelta(seconds=30)  # a 404 counts only from then
EARLIER = NOW - timedelta(seconds=30)
SPENT = History((_attempt(1, "uncertain", 3), _attempt(2, "uncertain", 2), _attempt(3, None)))
AFTER_A_MAYBE = History((_attempt(1, "uncertain", 2), _attempt(2, None)))


# What a replay no attempt of ours explains records and asks: the attempt maybe delivered,
# no receipt, the words naming the replay, and a halt as for a conflict.
UNEXPLAINED_REPLAY = (
    ("attempt_outcome", "uncertain"),
    ("receipt_id", None),
    ("receipt_source", None),
    ("halt.cause", "conflict"),
)


@dataclass(frozen=True)
class Case:
    item: Item
    evidence: AfterSend | Settling
    caps: Caps
    trigger: ItemTrigger | None  # None: nothing recorded
    ask: bool = False
    history: History = field(default_factory=History)
    # Further fields the decision must carry: outcome fields, or hold_s / gate_s / halt
    # (a dotted name reads a field of one: `halt.cause`).
    expect: tuple[tuple[str, object], ...] = ()


CASES = {
    # -- after a send
    "not-started": Case(_item(), AfterSend(NotStarted("cancel")), ASKABLE, ItemTrigger.RELEASE),
    "receipt": Case(
        _item(),
        AfterSend(Receipt("r1", DIGEST)),
        BLIND,
        ItemTrigger.ACK,
        expect=(("receipt_source", "send"), ("attempt_outcome", "sent")),
    ),
    "receipt-other-digest": Case(
        _item(), AfterSend(Receipt("r1", "sha256:x")), BLIND, ItemTrigger.CONFLICT
    ),
    # A replay no attempt of ours explains proves neither a delivery (a receiver may answer
    # "replayed" wrongly, or echo our digest back) nor its absence (a database restored
    # from an earlier copy may have sent it): maybe delivered, no receipt, and the run
    # halts as for a conflict.
    "replay-of-nothing-ours": Case(
        _item(),
        AfterSend(Receipt("r1", DIGEST, replayed=True)),
        DEDUPES,
        ItemTrigger.LOSE,
        expect=UNEXPLAINED_REPLAY,
    ),
    "replay-of-nothing-ours-no-digest": Case(
        _item(),
        AfterSend(Receipt("r1", None, replayed=True)),
        BLIND,
        ItemTrigger.LOSE,
        expect=UNEXPLAINED_REPLAY,
    ),
    "replay-of-our-earlier-try": Case(
        _item(2),
        AfterSend(Receipt("r1", DIGEST, replayed=True)),
        DEDUPES,
        ItemTrigger.ACK,
        history=History((_attempt(1, "uncertain"), _attempt(2, None))),
    ),
    # Earlier claims whose requests never left (released; past not_after at the claim)
    # cannot have reached the downstream: a replay is not explained by them.
    "replay-after-claims-that-never-left": Case(
        _item(2),
        AfterSend(Receipt("r1", DIGEST, replayed=True)),
        DEDUPES,
        ItemTrigger.LOSE,
        history=History((_attempt(1, "not_started"), _attempt(2, "expired"), _attempt(3, None))),
        expect=UNEXPLAINED_REPLAY,
    ),
    "unreachable": Case(
        _item(),
        AfterSend(_err(ErrorKind.NOT_SENT, unreachable=True)),
        ASKABLE,
        ItemTrigger.RELEASE,
        expect=(("hold_s", 1.0), ("next_attempt_at", clock.iso(NOW + timedelta(seconds=1)))),
    ),
    "throttled": Case(
        _item(),
        AfterSend(_err(ErrorKind.THROTTLED, retry_after=20)),
        ASKABLE,
        ItemTrigger.RETRY_LATER,
        expect=(("gate_s", 20.0), ("hold_s", 20.0)),
    ),
    "uncertain-asks-first": Case(
        _item(), AfterSend(_err(ErrorKind.UNCERTAIN)), ASKABLE, None, ask=True
    ),
    "uncertain-found": Case(
        _item(),
        AfterSend(_err(ErrorKind.UNCERTAIN), FOUND),
        ASKABLE,
        ItemTrigger.FOUND,
        expect=(("receipt_source", "query"), ("error", None)),
    ),
    "uncertain-other-digest": Case(
        _item(), AfterSend(_err(ErrorKind.UNCERTAIN), OTHER), ASKABLE, ItemTrigger.CONFLICT
    ),
    # The request left 3 s ago and timed out now: a 404 counts from now + query_delay.
    "uncertain-404-too-early": Case(
        _item(),
        AfterSend(_err(ErrorKind.UNCERTAIN), MISSING, NOW - timedelta(seconds=3)),
        DELAYED,
        ItemTrigger.LOSE,
        expect=(("next_attempt_at", clock.iso(NOW + timedelta(seconds=5))),),
    ),
    # A 504 (or a reset) 1 s after the request left: the receiver behind may still commit
    # it until timeout + query_delay after it left, not query_delay after the answer.
    "uncertain-early-answer-404-waits-from-the-request": Case(
        _item(),
        AfterSend(_err(ErrorKind.UNCERTAIN), MISSING, NOW - timedelta(seconds=1)),
        DELAYED,
        ItemTrigger.LOSE,
        expect=(("next_attempt_at", clock.iso(NOW + timedelta(seconds=7))),),
    ),
    # Without a query_delay, the timeout alone: an answer at once waits for it.
    "uncertain-early-answer-404-no-query-delay": Case(
        _item(),
        AfterSend(_err(ErrorKind.UNCERTAIN), MISSING, NOW),
        replace(ASKABLE, timeout_s=3.0),
        ItemTrigger.LOSE,
        expect=(("next_attempt_at", clock.iso(NOW + timedelta(seconds=3))),),
    ),
    "uncertain-timed-out-404-no-query-delay": Case(
        _item(),
        AfterSend(_err(ErrorKind.UNCERTAIN), MISSING, NOW - timedelta(seconds=3)),
        replace(ASKABLE, timeout_s=3.0),
        ItemTrigger.NOT_FOUND,
    ),
    "uncertain-404-retried": Case(
        _item(),
        AfterSend(_err(ErrorKind.UNCERTAIN), MISSING),
        ASKABLE,
        ItemTrigger.NOT_FOUND,
        expect=(("hold_s", 1.0),),
    ),
    "uncertain-404-attempts-spent": Case(
        _item(3),
        AfterSend(_err(ErrorKind.UNCERTAIN), MISSING),
        ASKABLE,
        ItemTrigger.GIVE_UP,
        history=SPENT,
    ),
    "uncertain-query-undecided": Case(
        _item(),
        AfterSend(_err(ErrorKind.UNCERTAIN), UNSURE),
        ASKABLE,
        ItemTrigger.LOSE,
        expect=(("next_attempt_at", None),),
    ),
    "uncertain-not-asked-at-a-stop": Case(
        _item(),
        AfterSend(_err(ErrorKind.UNCERTAIN), Unasked(), NOW),
        DELAYED,
        ItemTrigger.LOSE,
        expect=(("next_attempt_at", clock.iso(NOW + timedelta(seconds=8))),),
    ),
    "uncertain-blind": Case(_item(), AfterSend(_err(ErrorKind.UNCERTAIN)), BLIND, ItemTrigger.LOSE),
    "uncertain-dedupes": Case(
        _item(), AfterSend(_err(ErrorKind.UNCERTAIN)), DEDUPES, ItemTrigger.RETRY_LATER
    ),
    "uncertain-dedupes-spent-asks": Case(
        _item(3), AfterSend(_err(ErrorKind.UNCERTAIN)), DEDUPES, None, ask=True, history=SPENT
    ),
    "gone": Case(
        _item(),
        AfterSend(_err(ErrorKind.GONE)),
        BLIND,
        ItemTrigger.GIVE_UP,
        expect=(("halt.cause", "halted"), ("halt.detail", "endpoint gone (item 7): gone answer")),
    ),
    "conflict": Case(_item(), AfterSend(_err(ErrorKind.CONFLICT)), BLIND, ItemTrigger.CONFLICT),
    "permanent-suppresses": Case(
        _item(),
        AfterSend(_err(ErrorKind.PERMANENT, suppress_recipient="a@b", suppress_reason="550")),
        BLIND,
        ItemTrigger.GIVE_UP,
        expect=(("suppress_address", "a@b"),),
    ),
    "permanent-no-suppression-option": Case(
        _item(),
        AfterSend(_err(ErrorKind.PERMANENT, suppress_recipient="a@b")),
        ASKABLE,
        ItemTrigger.GIVE_UP,
        expect=(("suppress_address", None),),
    ),
    "refused-spent-never-reached": Case(
        _item(3),
        AfterSend(_err(ErrorKind.NOT_SENT)),
        BLIND,
        ItemTrigger.GIVE_UP,
        history=History((_attempt(1, "not_sent"), _attempt(2, "not_sent"), _attempt(3, None))),
    ),
    "refused-spent-after-a-maybe": Case(
        _item(3), AfterSend(_err(ErrorKind.NOT_SENT)), BLIND, ItemTrigger.LOSE, history=SPENT
    ),
    # A refusal answers its own request only: an earlier one may have been delivered.
    "permanent-after-a-maybe": Case(
        _item(2),
        AfterSend(_err(ErrorKind.PERMANENT, suppress_recipient="a@b", suppress_reason="550")),
        BLIND,
        ItemTrigger.LOSE,
        history=AFTER_A_MAYBE,
        expect=(("suppress_address", "a@b"),),
    ),
    "conflict-after-a-maybe": Case(
        _item(2),
        AfterSend(_err(ErrorKind.CONFLICT)),
        DEDUPES,
        ItemTrigger.LOSE,
        history=AFTER_A_MAYBE,
        expect=(
            ("halt.cause", "conflict"),
            ("halt.detail", "conflict on item 7: conflict answer"),
        ),
    ),
    "gone-after-a-maybe": Case(
        _item(2),
        AfterSend(_err(ErrorKind.GONE)),
        DEDUPES,
        ItemTrigger.LOSE,
        history=AFTER_A_MAYBE,
        expect=(("halt.cause", "halted"), ("halt.detail", "endpoint gone (item 7): gone answer")),
    ),
    "partial": Case(_item(), AfterSend(_err(ErrorKind.PARTIAL)), BLIND, ItemTrigger.LOSE),
    # -- resume, reconcile, a dead worker's items
    "settle-found": Case(
        _item(),
        Settling(Moment.SETTLE, FOUND),
        ASKABLE,
        ItemTrigger.FOUND,
        expect=(("attempt_outcome", "interrupted"),),
    ),
    "settle-other-digest": Case(
        _item(), Settling(Moment.SETTLE, OTHER), ASKABLE, ItemTrigger.CONFLICT
    ),
    "settle-404": Case(
        _item(), Settling(Moment.SETTLE, MISSING, EARLIER), DELAYED, ItemTrigger.NOT_FOUND
    ),
    "settle-404-too-early": Case(
        _item(),
        Settling(Moment.SETTLE, MISSING, LATER),
        DELAYED,
        ItemTrigger.LOSE,
        expect=(("next_attempt_at", clock.iso(LATER)),),
    ),
    "settle-404-too-early-dedupes": Case(
        _item(), Settling(Moment.SETTLE, MISSING, LATER), DEDUPES, ItemTrigger.RETRY_LATER
    ),
    "settle-404-too-early-unknown": Case(
        _item(state=ItemState.UNKNOWN), Settling(Moment.SETTLE, MISSING, LATER), DELAYED, None
    ),
    "settle-blind": Case(_item(), Settling(Moment.SETTLE, None), BLIND, ItemTrigger.LOSE),
    "settle-blind-dedupes": Case(
        _item(),
        Settling(Moment.SETTLE, None),
        replace(BLIND, idempotent=True),
        ItemTrigger.RETRY_LATER,
    ),
    "settle-waited-still-undecided": Case(
        _item(state=ItemState.UNKNOWN, next_attempt_at=clock.iso(EARLIER)),
        Settling(Moment.SETTLE, UNSURE, EARLIER),
        DELAYED,
        ItemTrigger.UNDECIDED,
    ),
    "settle-unknown-undecided": Case(
        _item(state=ItemState.UNKNOWN), Settling(Moment.SETTLE, UNSURE), ASKABLE, None
    ),
    # -- the runner's revisit of an item that waited for its query_delay
    "revisit-404-retried": Case(
        _item(state=ItemState.UNKNOWN),
        Settling(Moment.REVISIT, MISSING, EARLIER),
        DELAYED,
        ItemTrigger.NOT_FOUND,
        expect=(("next_attempt_at", clock.iso(NOW + timedelta(seconds=1))),),
    ),
    "revisit-404-attempts-spent": Case(
        _item(3, ItemState.UNKNOWN),
        Settling(Moment.REVISIT, MISSING, EARLIER),
        DELAYED,
        ItemTrigger.GIVE_UP,
        history=SPENT,
    ),
    "revisit-found": Case(
        _item(state=ItemState.UNKNOWN),
        Settling(Moment.REVISIT, FOUND, EARLIER),
        DELAYED,
        ItemTrigger.FOUND,
    ),
    # -- cancel: a pending item whose earlier attempt may have been delivered
    "cancel-found": Case(
        _item(state=ItemState.PENDING), Settling(Moment.CANCEL, FOUND), DEDUPES, ItemTrigger.FOUND
    ),
    "cancel-404": Case(
        _item(state=ItemState.PENDING, last_error="timed out"),
        Settling(Moment.CANCEL, MISSING, EARLIER),
        DEDUPES,
        ItemTrigger.NOT_FOUND,
        expect=(("error", "timed out"),),
    ),
    "cancel-404-too-early": Case(
        _item(state=ItemState.PENDING),
        Settling(Moment.CANCEL, MISSING, LATER),
        DEDUPES,
        ItemTrigger.DOUBT,
    ),
    "cancel-blind": Case(
        _item(state=ItemState.PENDING),
        Settling(Moment.CANCEL, None),
        replace(BLIND, idempotent=True),
        ItemTrigger.DOUBT,
    ),
    "cancel-other-digest": Case(
        _item(state=ItemState.PENDING),
        Settling(Moment.CANCEL, OTHER),
        DEDUPES,
        ItemTrigger.CONFLICT,
    ),
}


def _decide(case: Case) -> Decision:
    return decide(
        case.item, case.evidence, caps=case.caps, policy=POLICY, history=case.history, now=NOW
    )


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name", list(CASES))
def test_the_decision_table(name: str) -> None:
    """Each row: the move, whether a query must come first, and the fields recorded or
    done meanwhile (hold, gate, halt), for one answer or finding at one moment."""
    case = CASES[name]
    decision = _decide(case)
    assert decision.ask is case.ask
    trigger = None if decision.outcome is None else decision.outcome.trigger
    assert trigger == case.trigger, decision
    for name_, value in case.expect:
        head, *fields = name_.split(".")
        found: object = getattr(decision if hasattr(decision, head) else decision.outcome, head)
        for field_ in fields:
            found = getattr(found, field_)
        assert found == value, (name_, decision)
    if decision.outcome is not None:
        item_next(decision.outcome.trigger, case.item.state)  # a legal move


KINDS = st.sampled_from(list(ErrorKind))
SENT: st.SearchStrategy[Sent] = st.one_of(
    st.builds(NotStarted, st.just("held back")),
    st.builds(Receipt, st.just("r1"), st.sampled_from([None, DIGEST, "sha256:x"]), st.booleans()),
    st.builds(
        lambda kind, unreachable, retry_after: ChannelError(
            kind, "answer", unreachable=unreachable, retry_after=retry_after
        ),
        KINDS,
        st.booleans(),
        st.sampled_from([None, 0.5, 40.0]),
    ),
)
FINDINGS = st.sampled_from([FOUND, OTHER, MISSING, UNSURE])
CAPS = st.builds(
    Caps,
    st.booleans(),
    st.booleans(),
    st.sampled_from([0.0, 5.0]),
    st.sampled_from([0.0, 3.0]),
    st.booleans(),
)
HISTORIES = st.sampled_from(
    [History(), SPENT, History((_attempt(1, "not_sent"), _attempt(2, None)))]
)


@pytest.mark.timeout(60)
@settings(max_examples=400, deadline=None)
@given(
    sent=SENT,
    asked=st.one_of(st.none(), st.just(Unasked()), FINDINGS),
    caps=CAPS,
    attempts=st.integers(1, 4),
    history=HISTORIES,
)
def test_no_answer_leads_to_an_illegal_move_or_a_blind_resend(
    sent: Sent,
    asked: Answer | Unasked | None,
    caps: Caps,
    attempts: int,
    history: History,
) -> None:
    """For any answer, finding, channel and history: the move is legal from in_flight; a
    query is asked for only where the channel can be asked; a maybe-delivered answer on a
    channel that cannot dedupe goes back to pending only on a query's proof (a 404) or
    never having started; and the same inputs decide the same move (pure)."""
    item = _item(attempts)
    decision = decide(
        item, AfterSend(sent, asked), caps=caps, policy=POLICY, history=history, now=NOW
    )
    again = decide(item, AfterSend(sent, asked), caps=caps, policy=POLICY, history=history, now=NOW)
    assert decision == again
    if decision.ask:
        assert caps.queryable and asked is None and decision.outcome is None
        return
    assert decision.outcome is not None
    item_next(decision.outcome.trigger, ItemState.IN_FLIGHT)
    maybe = isinstance(sent, ChannelError) and sent.kind in (
        ErrorKind.UNCERTAIN,
        ErrorKind.PARTIAL,
    )
    if maybe and not caps.idempotent and decision.outcome.trigger is not ItemTrigger.FOUND:
        back = decision.outcome.trigger in (ItemTrigger.RETRY_LATER, ItemTrigger.NOT_FOUND)
        assert not back or asked == MISSING, decision
    # An item an earlier attempt may have delivered is never given up as failed (sending the
    # file again would deliver it twice), whatever answers this request, unless a query
    # proved that nothing was delivered under its key.
    # A replay of our own intent that no earlier attempt explains: never sent, never
    # failed (the next send of its file would plan it again), and the run halts.
    ours = isinstance(sent, Receipt) and sent.replayed and sent.intent_digest in (None, DIGEST)
    if ours and not history.may_have_reached(item):
        assert decision.outcome.trigger is ItemTrigger.LOSE, decision
        assert decision.outcome.error and "replay" in decision.outcome.error, decision
        assert decision.halt is not None and decision.halt.cause == "conflict", decision
    if history.maybe_delivered() and asked != MISSING:
        assert decision.outcome.trigger is not ItemTrigger.GIVE_UP, decision
        if isinstance(sent, ChannelError) and sent.kind is ErrorKind.CONFLICT:
            assert decision.outcome.trigger is not ItemTrigger.CONFLICT, decision


@pytest.mark.timeout(60)
@settings(max_examples=300, deadline=None)
@given(
    moment=st.sampled_from(list(Moment)),
    state=st.sampled_from([ItemState.IN_FLIGHT, ItemState.UNKNOWN, ItemState.PENDING]),
    finding=st.one_of(st.none(), FINDINGS),
    since=st.sampled_from([None, EARLIER, LATER]),
    caps=CAPS,
)
def test_no_finding_leads_to_an_illegal_move_or_proof_too_early(
    moment: Moment,
    state: ItemState,
    finding: Answer | None,
    since: datetime | None,
    caps: Caps,
) -> None:
    """For any settling moment, item state, finding and 404 window: a move fired from the
    state the moment settles is legal, and a 404 before it counts is never taken as proof
    that nothing was delivered."""
    if (moment is Moment.CANCEL) != (state is ItemState.PENDING):
        return  # cancel settles pending items; the others in_flight or unknown ones
    if moment is Moment.REVISIT and state is not ItemState.UNKNOWN:
        return
    item = _item(state=state)
    decision = decide(
        item, Settling(moment, finding, since), caps=caps, policy=POLICY, history=History(), now=NOW
    )
    if decision.outcome is None:
        return
    try:
        item_next(decision.outcome.trigger, state)
    except IllegalMove:
        pytest.fail(f"{decision.outcome.trigger} from {state}: {decision}")
    if since == LATER:
        assert decision.outcome.trigger is not ItemTrigger.NOT_FOUND


def _closed(n: int, outcome: str, started_s_ago: float, finished_s_ago: float) -> Attempt:
    started = clock.iso(NOW - timedelta(seconds=started_s_ago))
    finished = clock.iso(NOW - timedelta(seconds=finished_s_ago))
    return Attempt(7, n, started, finished, AttemptOutcome(outcome), None, None, None, None)


# DELAYED: timeout 3 s, query_delay 5 s. Each row: the item's attempts, and from when (in
# seconds from NOW) a 404 counts as "not sent" (None: at once).
WINDOWS: dict[str, tuple[tuple[Attempt, ...], float | None]] = {
    # A 504 (or a reset) at once: from the request's start, not from the answer.
    "answered-at-once": ((_closed(1, "uncertain", 1, 1),), 7.0),
    # The request ran its full timeout: the same moment, counted either way.
    "timed-out": ((_closed(1, "uncertain", 4, 1),), 4.0),
    # An answer later than start + timeout (a slow sender thread): never before end + delay.
    "ended-late": ((_closed(1, "uncertain", 10, 1),), 4.0),
    # Left open by a process that is gone: its start unknown, as late as now.
    "open": ((_attempt(1, None),), 8.0),
    # Closed by whoever found its holder gone, at that moment.
    "interrupted": ((_closed(1, "interrupted", 60, 2),), 6.0),
    # Attempts whose request never left, or never reached the receiver, prove nothing
    # either way: a 404 counts at once.
    "never-reached": (
        (
            _closed(1, "not_started", 1, 1),
            _closed(2, "expired", 1, 1),
            _closed(3, "not_sent", 1, 1),
            _closed(4, "throttled", 1, 1),
        ),
        None,
    ),
    # A claim released unstarted after an uncertain attempt: the uncertain one's window.
    "released-after-an-early-answer": (
        (_closed(1, "uncertain", 2, 2), _closed(2, "not_started", 0.5, 0.5)),
        6.0,
    ),
    # Every attempt that may have reached the receiver counts, not only the last.
    "the-latest-window-of-all": (
        (_closed(1, "uncertain", 1, 1), _closed(2, "throttled", 0.5, 0.5)),
        7.0,
    ),
}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name", list(WINDOWS))
def test_a_404_counts_from_timeout_plus_query_delay_after_the_request_left(name: str) -> None:
    """`not_found_counts_from`: the receiver may commit a request until `timeout +
    query_delay` after it left, whatever ended the attempt (never before its end plus
    `query_delay`); an attempt whose start is not known counts from its end or from now."""
    attempts, seconds = WINDOWS[name]
    expected = None if seconds is None else NOW + timedelta(seconds=seconds)
    assert not_found_counts_from(DELAYED, attempts, NOW) == expected


@pytest.mark.timeout(30)
def test_an_atomic_write_needs_no_window() -> None:
    """The outbox (no timeout, no query_delay): a missing file is proof at once."""
    assert not_found_counts_from(ASKABLE, (_closed(1, "uncertain", 1, 1),), NOW) is None


# A status query's try left at `asked`; its 404 is judged at NOW, after the window closed at
# CLOSED. Where a settle, a revisit or a cancel asks.
CLOSED = NOW - timedelta(seconds=10)
ASKING = [
    (Moment.SETTLE, ItemState.IN_FLIGHT),
    (Moment.SETTLE, ItemState.UNKNOWN),
    (Moment.REVISIT, ItemState.UNKNOWN),
    (Moment.CANCEL, ItemState.PENDING),
]


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("moment", "state"), ASKING)
def test_a_404_looked_up_before_the_window_closed_proves_nothing_however_late_it_came_back(
    moment: Moment, state: ItemState
) -> None:
    """What counts is when the receiver looked the key up, after the query's try left
    (`asked_at`), not when its answer came back: a 404 asked for while the receiver could
    still commit the request, and answered after the window, proves nothing. Asked for after
    the window, the same 404 is proof (the control)."""

    def decided(asked: datetime) -> ItemTrigger | None:
        answer = replace(MISSING, asked_at=asked)
        decision = decide(
            _item(state=state),
            Settling(moment, answer, CLOSED),
            caps=DELAYED,
            policy=POLICY,
            history=History(),
            now=NOW,
        )
        return None if decision.outcome is None else decision.outcome.trigger

    assert decided(CLOSED - timedelta(seconds=1)) is not ItemTrigger.NOT_FOUND
    assert decided(CLOSED + timedelta(seconds=1)) is ItemTrigger.NOT_FOUND


@pytest.mark.timeout(30)
def test_after_a_send_a_404_counts_from_when_its_query_left() -> None:
    """The sender's own query after an uncertain answer: its 404 is judged by when its try
    left too. Asked before the window closed it proves nothing, whenever the send's answer
    came; asked after, it is proof."""
    started = CLOSED - timedelta(seconds=DELAYED.timeout_s + DELAYED.query_delay_s)

    def decided(asked: datetime, answered: datetime) -> ItemTrigger | None:
        sent = AfterSend(
            _err(ErrorKind.UNCERTAIN), replace(MISSING, asked_at=asked), started=started
        )
        outcome = decide(
            _item(), sent, caps=DELAYED, policy=POLICY, history=History(), now=answered
        ).outcome
        return None if outcome is None else outcome.trigger

    # The send's answer came at once (a 504): the window closes at CLOSED all the same.
    early = decided(CLOSED - timedelta(seconds=1), answered=started)
    assert early is ItemTrigger.LOSE
    late = decided(CLOSED + timedelta(seconds=1), answered=started)
    assert late is ItemTrigger.NOT_FOUND  # proven undelivered: sent again, under the same key
