"""What an answer, or a query's finding, means for one item: the one decision
(docs/design.md section 7), for the runner (an answer to a send, and the status query that
followed it), for resume, reconcile and a dead worker's items (`Moment.SETTLE`), for the
runner's revisit of an item that waited for its query_delay (`Moment.REVISIT`) and for
cancel (`Moment.CANCEL`).

Pure: no store, no clock, no channel. The caller reads what the decision rests on (the
item, its attempts, the channel's capabilities, the policy, the time), asks the channel
first where `wants_finding` says so, decides once and records it. Only the policy's backoff
(full jitter) is not fixed by the inputs."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from notifier.domain import clock
from notifier.domain.answers import ChannelError, ErrorKind, Receipt
from notifier.domain.evidence import (
    AfterSend,
    Answer,
    Caps,
    Decision,
    Finding,
    Halt,
    HaltCause,
    History,
    Moment,
    NotStarted,
    Sent,
    Settling,
    Unasked,
    not_found_counts_from,
    request_window,
)
from notifier.domain.records import (
    MAYBE_DELIVERED_OUTCOMES,
    NEVER_REACHED,
    AttemptOutcome,
    Item,
    Outcome,
)
from notifier.domain.retry import Action, RetryPolicy, Verdict
from notifier.domain.state_machine import ItemState, ItemTrigger

# The records it takes and returns (evidence.py), for the callers that know them from here.
__all__ = [
    "NEVER_REACHED",
    "AfterSend",
    "Answer",
    "Caps",
    "Decision",
    "Finding",
    "Halt",
    "HaltCause",
    "History",
    "Moment",
    "NotStarted",
    "Sent",
    "Settling",
    "Unasked",
    "acknowledged",
    "decide",
    "not_found_counts_from",
    "request_window",
    "unexplained_replay",
    "wants_finding",
]


def decide(
    item: Item,
    evidence: AfterSend | Settling,
    *,
    caps: Caps,
    policy: RetryPolicy,
    history: History,
    now: datetime,
) -> Decision:
    """What `evidence` means for `item` (docs/design.md sections 3 and 7). `now`: when the
    answer (or the finding) came; every wait and stored time counts from it."""
    if isinstance(evidence, AfterSend):
        return _after_send(item, evidence, caps, policy, history, now)
    if evidence.moment is Moment.CANCEL:
        return _at_cancel(item, evidence, caps, now)
    settled = _settle(item, evidence, caps, now)
    if evidence.moment is Moment.REVISIT and settled.outcome is not None:
        return replace(
            settled, outcome=_retry_or_give_up(item, settled.outcome, policy, history, now)
        )
    return settled


# ---------------------------------------------------------------------- after a send


def wants_finding(
    item: Item, error: ChannelError, *, caps: Caps, policy: RetryPolicy, history: History,
    now: datetime,
) -> bool:  # fmt: skip
    """Whether deciding on `error` needs a status query's finding first: the sender asks it
    before the one decision (`decide` with `AfterSend(error, finding)`), by this same rule."""
    unreachable = error.kind is ErrorKind.NOT_SENT and error.unreachable
    return not unreachable and _asks(_verdict(item, error, caps, policy, history, now), caps)


def _verdict(item: Item, error: ChannelError, caps: Caps, policy: RetryPolicy,
             history: History, now: datetime) -> Verdict:  # fmt: skip
    return policy.judge(
        error, attempts=item.attempts, elapsed_s=history.elapsed_s(item, now),
        idempotent=caps.idempotent, queryable=caps.queryable,
        throttled_before=history.throttled(),
    )  # fmt: skip


def _asks(verdict: Verdict, caps: Caps) -> bool:
    """A verdict that only a status query can settle (an uncertain answer the downstream
    cannot dedupe, or out of attempts), on a channel that can be asked."""
    return verdict.action in (Action.QUERY, Action.EXHAUSTED) and caps.queryable


def _after_send(
    item: Item, sent: AfterSend, caps: Caps, policy: RetryPolicy, history: History, now: datetime
) -> Decision:
    result = sent.result
    if isinstance(result, NotStarted):
        # Nothing left: back to pending, its attempt closed as not started, and it counts
        # as never attempted (store.ledger.record gives the attempt back).
        return Decision(Outcome(item.seq, ItemTrigger.RELEASE, AttemptOutcome.NOT_STARTED))
    if isinstance(result, Receipt):
        return _by_receipt(item, result, history)
    error = result
    if error.kind is ErrorKind.NOT_SENT and error.unreachable:
        # Nothing reached the receiver: its channel's failure, never the item's. Back to
        # pending, the attempt given back (recorded as not_sent), after a backoff; the
        # runner takes the channel as down when this keeps happening.
        wait = policy.backoff(error, item.attempts)
        outcome = Outcome(
            item.seq,
            ItemTrigger.RELEASE,
            AttemptOutcome.NOT_SENT,
            error=str(error),
            next_attempt_at=clock.iso(clock.later(wait, now)),
        )
        return Decision(outcome, hold_s=wait)
    verdict = _verdict(item, error, caps, policy, history, now)
    # Every branch closes the attempt with what the error said.
    said = AttemptOutcome(error.kind.value)
    closed = Outcome(
        item.seq,
        ItemTrigger.LOSE,
        said,
        http_status=error.http_status,
        error=str(error),
        retry_after_s=error.retry_after,
    )
    message, gate, wait_s = str(error), None, verdict.wait_s
    if verdict.pause_channel:
        # Every throttled answer closes the channel, whatever becomes of this item (and, with
        # the outcome, for every other worker of a shared run), as long as its sender did.
        gate = wait_s = sent.gate_s if sent.gate_s is not None else verdict.wait_s
        closed = replace(closed, gate_until=clock.iso(clock.later(gate, now)))
    if verdict.action is Action.RETRY:
        next_at = clock.iso(clock.later(wait_s, now))
        retry = replace(closed, trigger=ItemTrigger.RETRY_LATER, next_attempt_at=next_at)
        return Decision(retry, hold_s=wait_s, gate_s=gate)
    if _asks(verdict, caps):
        if sent.finding is None:
            return Decision(None, ask=True, gate_s=gate)
        by_query = _by_query(
            item, error, sent.finding, closed, caps, policy, history, now, sent.started
        )
        return replace(by_query, gate_s=gate)
    if verdict.action in (Action.CONFLICT, Action.GONE, Action.FAIL):
        return _refused(item, error, verdict.action, closed, caps, history, gate)
    maybe = said in MAYBE_DELIVERED_OUTCOMES or history.maybe_delivered()
    if verdict.action is Action.EXHAUSTED and not maybe:
        why = (
            f"gave up: its deadline passed while the channel kept throttling: {message}"
            if error.kind is ErrorKind.THROTTLED
            else f"gave up after {item.attempts} attempts: {message}"
        )
        given_up = replace(closed, trigger=ItemTrigger.GIVE_UP, error=why)
        return Decision(given_up, gate_s=gate)
    lost = replace(closed, error=f"{message}; may have been delivered, not sent again")
    return Decision(lost, gate_s=gate)


def _refused(
    item: Item,
    error: ChannelError,
    action: Action,
    closed: Outcome,
    caps: Caps,
    history: History,
    gate: float | None,
) -> Decision:
    """This request refused: a conflict or the endpoint gone (either halts the run) or a
    permanent failure. A refusal answers this request only: an earlier one of the item may
    have been delivered (its answer lost; a receiver may answer a key it already took with a
    conflict), so such an item is not given up as failed, which sending the file again would
    deliver a second time, but left unknown, as when its attempts run out."""
    message = str(error)
    maybe = history.maybe_delivered()
    if action is Action.CONFLICT and not maybe:
        conflict = replace(closed, trigger=ItemTrigger.CONFLICT, error=f"conflict: {message}")
        return Decision(conflict, gate_s=gate)
    if action is Action.FAIL and error.suppress_recipient and caps.suppress_on_reject:
        # A failure that rejects its recipient for good carries the address to the
        # suppression list, stored with the failure in its transaction.
        closed = replace(
            closed, suppress_address=error.suppress_recipient, suppress_reason=error.suppress_reason
        )
    if maybe:
        closed = replace(
            closed, error=f"{message}; an earlier attempt may have been delivered, not sent again"
        )
    else:
        closed = replace(closed, trigger=ItemTrigger.GIVE_UP)
    halts = {
        Action.GONE: Halt(HaltCause.HALTED, f"endpoint gone (item {item.seq}): {message}"),
        # A conflict however it is met: something else may write under our keys (exit 4).
        Action.CONFLICT: Halt(HaltCause.CONFLICT, f"conflict on item {item.seq}: {message}"),
    }
    return Decision(closed, gate_s=gate, halt=halts.get(action))


def unexplained_replay(item: Item, receipt: Receipt, history: History) -> bool:
    """A "replayed" answer that no attempt of ours can explain: nothing of this item can
    have reached the downstream before this attempt (`History.may_have_reached`). The
    sender reads it too, the moment the answer arrives, to stop every other send."""
    return receipt.replayed and not history.may_have_reached(item)


def _by_receipt(item: Item, receipt: Receipt, history: History) -> Decision:
    if receipt.intent_digest and receipt.intent_digest != item.intent_digest:
        return Decision(
            Outcome(
                item.seq,
                ItemTrigger.CONFLICT,
                AttemptOutcome.CONFLICT,
                error=f"conflict: downstream answered for {receipt.intent_digest}",
            )
        )
    if unexplained_replay(item, receipt, history):
        # It proves no delivery (a receiver may answer "replayed" wrongly, or echo our
        # digest back), nor that nothing was delivered (a database restored from a copy
        # taken before its run sent, or another copy of it, may have sent it). So the item
        # is maybe delivered, never sent, never failed (a failed row is planned again by
        # the next send of its file); and the run halts at once, as for a conflict, so a
        # receiver that answers so wrongly cannot leave a whole batch unknown.
        lost = Outcome(
            item.seq,
            ItemTrigger.LOSE,
            AttemptOutcome.UNCERTAIN,
            error=f"the downstream answered as a replay of an earlier delivery under this "
            f"key (receipt {receipt.receipt_id}), though no earlier attempt of this item can "
            "have reached it: maybe delivered (a database restored from an earlier copy of "
            "this one, or another copy of it, sent it) or not (a receiver that answers "
            "replay wrongly)",
        )
        halt = Halt(
            HaltCause.CONFLICT,
            f"conflict on item {item.seq}: a replay no attempt of ours can explain; "
            "left unknown (maybe delivered)",
        )
        return Decision(lost, halt=halt)
    return Decision(acknowledged(item, receipt))


def acknowledged(item: Item, receipt: Receipt) -> Outcome:
    """The downstream accepted the item: sent, with the receipt it gave."""
    return Outcome(
        item.seq,
        ItemTrigger.ACK,
        AttemptOutcome.SENT,
        receipt_id=receipt.receipt_id,
        receipt_source="send",
    )


def _after_send_window(
    caps: Caps, started: datetime | None, history: History, now: datetime
) -> datetime | None:
    """From when a 404 counts after an answer that came at `now` to a request that left at
    `started`: its own window (`request_window`), and that of every earlier attempt closed
    (the open attempt in `history` is this one)."""
    earlier = [a for a in history.attempts if a.finished_at is not None]
    bounds = [not_found_counts_from(caps, earlier, now)]
    if caps.query_delay_s + caps.timeout_s > 0:
        bounds.append(request_window(caps, started, now))
    return max((b for b in bounds if b is not None), default=None)


def _by_query(
    item: Item,
    error: ChannelError,
    finding: Answer | Unasked,
    closed: Outcome,
    caps: Caps,
    policy: RetryPolicy,
    history: History,
    now: datetime,
    started: datetime | None,
) -> Decision:
    """A maybe-delivered item on a channel that can be asked: what its query found (or, not
    asked, unknown, to be asked about by whoever settles the run next)."""
    # From when a 404 counts: the window of this attempt's request (from when it left,
    # whatever ended it) and of every earlier one that may have reached the receiver.
    since = _after_send_window(caps, started, history, now)
    if isinstance(finding, Unasked):
        again = clock.iso(since or now)
        return Decision(
            replace(
                closed,
                error=f"{error}; may have been delivered: asked about later ({finding.why})",
                next_attempt_at=again,
            )
        )
    message = f"{error}; {finding.detail}"
    if finding.finding is Finding.FOUND and finding.receipt is not None:
        found = replace(
            closed,
            trigger=ItemTrigger.FOUND,
            error=None,
            receipt_id=finding.receipt.receipt_id,
            receipt_source="query",
            evidence="query after an uncertain send",
        )
        return Decision(found)
    if finding.finding is Finding.CONFLICT:
        return Decision(replace(closed, trigger=ItemTrigger.CONFLICT, error=f"conflict: {message}"))
    if since is not None and _looked_early(finding, since, now):
        # Too early for a 404 to prove anything: the receiver may still be committing the
        # request (a 504 or a reset can come at once while it does). The item waits,
        # unknown, and is asked about again once the window has passed.
        again = clock.iso(since)
        return Decision(
            replace(
                closed,
                trigger=ItemTrigger.LOSE,
                error=f"{message}; not found yet, asking again at {again} (timeout + "
                "query_delay after the request left)",
                next_attempt_at=again,
            )
        )
    if finding.finding is Finding.NOT_FOUND:
        retry = policy.judge(
            error,
            attempts=item.attempts,
            elapsed_s=history.elapsed_s(item, now),
            idempotent=True,
            queryable=True,
            throttled_before=history.throttled(),
        )
        if retry.action is Action.RETRY:
            # Proven undelivered, so re-sending under the same key is safe.
            again = clock.iso(clock.later(retry.wait_s, now))
            outcome = replace(
                closed, trigger=ItemTrigger.NOT_FOUND, error=message, next_attempt_at=again
            )
            return Decision(outcome, hold_s=retry.wait_s)
        return Decision(
            replace(
                closed,
                trigger=ItemTrigger.GIVE_UP,
                error=f"gave up after {item.attempts} attempts: {message}",
            )
        )
    return Decision(replace(closed, error=f"{message}; may have been delivered, not sent again"))


# ---------------------------------------------------------------------- settling


def _looked_early(answer: Answer | Unasked | None, since: datetime, now: datetime) -> bool:
    """Whether `answer` is a 404 that proves nothing yet: the receiver looked the key up
    before `since`, while it could still commit the request. It looked after the query's try
    left (`asked_at`), however late the answer came back; where that moment is not known,
    `now` stands for it."""
    if not isinstance(answer, Answer) or answer.finding is not Finding.NOT_FOUND:
        return False
    looked = answer.asked_at if answer.asked_at is not None else now
    return looked < since


def _not_delivered(answer: Answer) -> str:
    """An item's error once a 404 that counts proved it undelivered: what is true of it from
    then on, in place of the doubt (or the question still to ask) it carried before."""
    return f"not delivered: {answer.detail}"


def _head(item: Item) -> str:
    return f"item {item.seq} ({item.item_id}) key {item.idempotency_key}:"


def _settle(item: Item, settling: Settling, caps: Caps, now: datetime) -> Decision:
    """An `in_flight` (crashed mid-attempt) or `unknown` item. Before `not_found_from` a 404
    proves nothing: the item waits, unknown, with that moment as the time to ask again."""
    closes = AttemptOutcome.INTERRUPTED if item.state is ItemState.IN_FLIGHT else None
    head = _head(item)
    answer = settling.finding
    since = settling.not_found_from
    if answer is not None and answer.finding is Finding.FOUND:
        assert answer.receipt is not None
        match = "digest matches" if answer.receipt.intent_digest else "no digest reported"
        return Decision(
            Outcome(
                item.seq,
                ItemTrigger.FOUND,
                closes,
                receipt_id=answer.receipt.receipt_id,
                receipt_source="query",
                evidence=f"query: {match}",
            ),
            f"{head} receipt found ({match}) → sent; not sent again",
        )
    if answer is not None and answer.finding is Finding.CONFLICT:
        return Decision(
            Outcome(item.seq, ItemTrigger.CONFLICT, closes, error=f"conflict: {answer.detail}"),
            f"{head} CONFLICT: {answer.detail} → failed; never overwritten",
        )
    early = since is not None and now < since
    if since is not None and _looked_early(answer, since, now):
        when = clock.iso(since)
        line = (
            f"{head} not found yet, but the receiver may still commit it until {when} "
            "(query_delay) → unknown; NOT sent meanwhile, asked again then"
        )
        if item.state is ItemState.UNKNOWN:
            return Decision(None, line)
        if caps.idempotent:
            # Sent again under the same key, which the receiver dedupes: never proven
            # undelivered, the item stays "maybe delivered" (cancel and expiry see that).
            return Decision(
                Outcome(
                    item.seq,
                    ItemTrigger.RETRY_LATER,
                    closes,
                    error="outcome unknown after a stop: not found yet",
                ),
                f"{head} not found yet (the receiver may still commit it until {when}) → the "
                "channel dedupes by key; will send again with the same key",
            )
        return Decision(
            Outcome(
                item.seq,
                ItemTrigger.LOSE,
                closes,
                error=f"outcome unknown after a stop: not found yet; asking again at {when}",
                next_attempt_at=when,
            ),
            line,
        )
    if answer is not None and answer.finding is Finding.NOT_FOUND:
        then = (
            "its run is finished or being cancelled, so it is not sent; sending the file "
            "again sends it"
            if settling.run_finished
            else "will send again with the same key"
        )
        # Written with the move, over an earlier "not found yet; asking again at …": proven
        # now, the item is asked about no more (a finished run never sends it either).
        return Decision(
            Outcome(item.seq, ItemTrigger.NOT_FOUND, closes, error=_not_delivered(answer)),
            f"{head} not found → nothing was delivered; {then}",
        )
    why = answer.detail if answer is not None else "the channel cannot be queried"
    if item.state is ItemState.UNKNOWN and item.next_attempt_at is not None and not early:
        # It waited for its query_delay and the query still cannot decide: a plain unknown.
        return Decision(
            Outcome(item.seq, ItemTrigger.UNDECIDED, error=f"outcome unknown: {why}"),
            f"{head} still unknown ({why}): only a decision by hand settles it now",
        )
    if item.state is ItemState.UNKNOWN:
        return Decision(None, f"{head} still unknown ({why})")
    if caps.idempotent:
        return Decision(
            Outcome(
                item.seq,
                ItemTrigger.RETRY_LATER,
                closes,
                error=f"outcome unknown after a stop ({why})",
            ),
            f"{head} outcome unknown ({why}) → the channel dedupes by key; will send again "
            "with the same key",
        )
    return Decision(
        Outcome(item.seq, ItemTrigger.LOSE, closes, error=f"outcome unknown after a stop ({why})"),
        f"{head} outcome unknown ({why}) → unknown; NOT sent again",
    )


def _retry_or_give_up(
    item: Item, outcome: Outcome, policy: RetryPolicy, history: History, now: datetime
) -> Outcome:
    """The runner's revisit: a waiting item proven undelivered is sent again like any
    retry, after the backoff, and only while its attempts and deadline last."""
    if outcome.trigger != ItemTrigger.NOT_FOUND:
        return outcome
    if item.not_after is not None and clock.parse(item.not_after) <= now:
        # Proven undelivered past its deadline: pending, and the next expiry pass expires
        # it (never sent), rather than failed for attempts it can no longer make.
        return outcome
    retry = policy.judge(
        ChannelError(ErrorKind.UNCERTAIN, item.last_error or "outcome unknown"),
        attempts=item.attempts,
        elapsed_s=history.elapsed_s(item, now),
        idempotent=True,
        queryable=True,
        throttled_before=history.throttled(),
    )
    if retry.action is Action.RETRY:
        return replace(outcome, next_attempt_at=clock.iso(clock.later(retry.wait_s, now)))
    return replace(
        outcome,
        trigger=ItemTrigger.GIVE_UP,
        error=f"gave up after {item.attempts} attempts: not delivered (query after query_delay)",
    )


def _at_cancel(item: Item, settling: Settling, caps: Caps, now: datetime) -> Decision:
    """A pending item whose last uncertain attempt may have been delivered, at cancel:
    settled by what the query found, and otherwise unknown (a cancelled run never reports a
    maybe-delivered item as never attempted)."""
    head = _head(item)
    answer = settling.finding
    since = settling.not_found_from
    if since is not None and _looked_early(answer, since, now):
        # Too early for a 404 to prove anything: the receiver may still commit the request.
        answer = Answer(
            Finding.UNCERTAIN,
            detail=f"not found yet, but the receiver may still commit it until "
            f"{clock.iso(since)} (query_delay)",
        )
    if answer is not None and answer.finding is Finding.FOUND:
        assert answer.receipt is not None
        return Decision(
            Outcome(
                item.seq,
                ItemTrigger.FOUND,
                receipt_id=answer.receipt.receipt_id,
                receipt_source="query",
                evidence="query at cancel after an uncertain attempt",
            ),
            f"{head} receipt found → sent",
        )
    if answer is not None and answer.finding is Finding.CONFLICT:
        return Decision(
            Outcome(item.seq, ItemTrigger.CONFLICT, error=f"conflict: {answer.detail}"),
            f"{head} CONFLICT: {answer.detail} → failed; never overwritten",
        )
    if answer is not None and answer.finding is Finding.NOT_FOUND:
        return Decision(
            Outcome(item.seq, ItemTrigger.NOT_FOUND, error=item.last_error),
            f"{head} not found → nothing was delivered; stays pending (attempted, not sent)",
        )
    why = answer.detail if answer is not None else "the channel cannot be queried"
    return Decision(
        Outcome(
            item.seq,
            ItemTrigger.DOUBT,
            error=f"an earlier attempt may have been delivered; cancelled before a retry ({why})",
        ),
        f"{head} may have been delivered ({why}) → unknown; NOT sent again",
    )
