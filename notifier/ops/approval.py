"""Approvals (docs/design.md section 10): a run planned with `--require-approval` waits in
`awaiting_approval` until `notifier approve` binds an approval to its fingerprint, its state
version and the operator, until an expiry. Nothing is sent for such a run unless the intents
stored *now* still hash to the fingerprint that was approved, and the approval has not
expired. The fingerprint is always recomputed from the stored items and the stored channel
snapshot; the runs row's copy is never trusted, since whoever could alter the intents could
alter it too.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import Any

from notifier.domain import clock
from notifier.domain.errors import BadInput, NextStep, Refused
from notifier.domain.intent import intent_digest, run_fingerprint
from notifier.domain.records import Item, Run, notifications
from notifier.domain.state_machine import FINISHED_RUN_STATES, RunState
from notifier.engine.run_control import RunControl
from notifier.store import Store

DEFAULT_EXPIRES_IN = "24h"
# The longest an approval may hold: whoever approves vouches for the content until then.
MAX_EXPIRES_IN = timedelta(days=30)
PREVIEW_ROWS = 3
_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")
_FIELDS = ("operator", "approved_at", "expires_at", "fingerprint", "state_version")
# How the reason of a pause for the approval begins (its cause: StopCause.APPROVAL_EXPIRED).
APPROVAL_PAUSE = "its approval"
# The expiry of an approval whose record is gone or names other content: long past.
_WITHDRAWN = datetime.min.replace(tzinfo=UTC)


class ApprovalRefused(Refused):
    """Sending (or approving) is refused for safety: exit 4."""


class ApprovalUsage(BadInput):
    """The command cannot apply to this run as asked: exit 2."""


@dataclass(frozen=True)
class Approval:
    operator: str
    approved_at: str
    expires_at: str
    fingerprint: str
    state_version: int

    def as_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _FIELDS}


class Unapproved(Enum):
    """Why a run that requires an approval may not send now, or why an approval was not
    given: what the command layer words, with the command that works."""

    AWAITING = "it is awaiting approval"
    NO_RECORD = "it has no valid approval record"
    EXPIRED = "its approval expired"
    CHANGED = "its stored notifications no longer hash to the fingerprint approved"
    CHANGED_SINCE_PLANNED = (
        "its stored notifications no longer hash to the fingerprint computed when it was planned"
    )
    NOT_ITS_FINGERPRINT = "the fingerprint given is not that of its stored notifications"


class NotApproved(ApprovalRefused):
    """Nothing is sent (or approved) for run `run_id`, because of `why` (exit 4). `approval`:
    the record that no longer holds (EXPIRED, CHANGED); `given`: the fingerprint refused
    (NOT_ITS_FINGERPRINT); `run`: the run whose notifications changed (CHANGED,
    CHANGED_SINCE_PLANNED), whose options plan its file again. Typed, so that the command
    layer says what to do next."""

    def __init__(
        self,
        run_id: str,
        why: Unapproved,
        *,
        approval: Approval | None = None,
        given: str = "",
        run: Run | None = None,
    ) -> None:
        super().__init__(f"run {run_id}: {why.value}; nothing was sent or approved.")
        self.run_id = run_id
        self.why = why
        self.approval = approval
        self.given = given
        self.run = run


def parse_duration(text: str) -> timedelta:
    """`90s`, `30m`, `1h`, `2d`, `1h30m`: a positive duration, or ApprovalUsage."""
    match = _DURATION.match(text.strip())
    if not text.strip() or match is None or not any(match.groups()):
        raise ApprovalUsage(f"--expires-in {text!r}: use a duration such as 30m, 1h, 1h30m or 2d.")
    d, h, m, s = (int(g or 0) for g in match.groups())
    try:
        span = timedelta(days=d, hours=h, minutes=m, seconds=s)
    except OverflowError:  # more days than a timedelta holds: longer than 30 days too
        span = timedelta.max
    if span <= timedelta(0):
        raise ApprovalUsage(f"--expires-in {text!r}: the approval must last some time.")
    if span > MAX_EXPIRES_IN:
        raise ApprovalUsage(
            f"--expires-in {text!r} is longer than the 30 days an approval may hold; nothing "
            "was approved. Approve for 30d or less, and approve again if the run still waits "
            "to be sent then."
        )
    return span


def abridged(fingerprint: str) -> str:
    """A fingerprint cut short enough to recognise and too short to paste as an approval:
    a refusal names what it was given this way, never a whole fingerprint."""
    text = fingerprint.strip()
    return text if len(text) <= 19 else text[:19] + "…"


def requires_approval(run: Run) -> bool:
    """A run needs an approval if it was planned with --require-approval, or if anything
    about it says it went through approval: a missing record is never read as approved."""
    return (
        bool(run.options.get("require_approval"))
        or run.approval is not None
        or run.state in (RunState.AWAITING_APPROVAL, RunState.APPROVED)
    )


def recompute_fingerprint(store: Store, run: Run) -> str:
    """The approval fingerprint from the stored intents as they are now: every item's digest
    recomputed from its channel, target and payload, in order, plus the stored snapshot."""
    digests = (
        intent_digest(item.channel, item.target, item.payload)
        for item in store.queries.items(run.run_id)
    )
    return run_fingerprint(digests, run.channel_snapshot)


def stored_approval(run: Run) -> Approval | None:
    """The run's approval record, or None when it is missing or malformed."""
    raw = run.approval
    if not isinstance(raw, Mapping) or any(name not in raw for name in _FIELDS):
        return None
    try:
        approval = Approval(
            operator=str(raw["operator"]),
            approved_at=str(raw["approved_at"]),
            expires_at=str(raw["expires_at"]),
            fingerprint=str(raw["fingerprint"]),
            state_version=int(raw["state_version"]),
        )
        clock.parse(approval.expires_at)
    except (TypeError, ValueError):
        return None
    return approval


def lapsed(run: Run) -> str | None:
    """When the approval of an unfinished run that needs one expired, or None: it shows as
    approved, yet it will send nothing until approved again."""
    approval = stored_approval(run)
    if run.state in FINISHED_RUN_STATES or approval is None:
        return None
    return approval.expires_at if clock.parse(approval.expires_at) <= clock.now() else None


def approve(
    store: Store, run: Run, fingerprint: str, expires_in: timedelta, operator: str
) -> Approval:
    """Bind an approval to `fingerprint` (which must be the one the stored intents hash to)
    and to the run's current state version, or refuse."""
    if run.state in FINISHED_RUN_STATES:
        raise ApprovalUsage(f"run {run.run_id} is {run.state.value}; there is nothing to approve.")
    if not requires_approval(run):
        raise ApprovalUsage(
            f"run {run.run_id} was not planned with --require-approval, so it needs no approval."
        )
    if run.fingerprint == "":
        raise ApprovalUsage(
            f"run {run.run_id} is still drafting, so there is nothing to approve yet"
        ).advise(NextStep.RESUME_TO_APPROVE, run.run_id)
    version = store.ledger.state_version(run.run_id)
    actual = recompute_fingerprint(store, run)
    if actual != run.fingerprint:
        raise NotApproved(run.run_id, Unapproved.CHANGED_SINCE_PLANNED, run=run)
    if fingerprint.strip() != actual:
        raise NotApproved(run.run_id, Unapproved.NOT_ITS_FINGERPRINT, given=fingerprint)
    now = clock.now()
    approval = Approval(
        operator=operator,
        approved_at=clock.iso(now),
        expires_at=clock.iso(now + expires_in),
        fingerprint=actual,
        state_version=version,
    )
    store.ledger.record_approval(run.run_id, approval.as_json(), version)
    return approval


def check_can_send(store: Store, run: Run) -> None:
    """Refuse (NotApproved) to send anything for a run that requires an approval it does not
    validly have, checked against the intents stored now. Called before the lease is taken,
    so a refusal leaves the run as it was: no lease, no move, no event."""
    if not requires_approval(run):
        return
    if run.state is RunState.AWAITING_APPROVAL:
        raise NotApproved(run.run_id, Unapproved.AWAITING)
    approval = stored_approval(run)
    if approval is None:
        raise NotApproved(run.run_id, Unapproved.NO_RECORD)
    if clock.parse(approval.expires_at) <= clock.now():
        raise NotApproved(run.run_id, Unapproved.EXPIRED, approval=approval)
    if recompute_fingerprint(store, run) != approval.fingerprint:
        raise NotApproved(run.run_id, Unapproved.CHANGED, approval=approval, run=run)


@dataclass(frozen=True)
class Glimpse:
    """The start of a run's review: its lines, and how many notifications they leave out."""

    lines: list[str]
    unshown: int


def preview(store: Store, run: Run, rows: int = PREVIEW_ROWS) -> Glimpse:
    """Counts per channel and the first rows exactly as stored (and so as they will be sent),
    and how many more there are."""
    per_channel: Counter[str] = Counter()
    first: list[Item] = []
    for item in store.queries.items(run.run_id):
        per_channel[item.channel] += 1
        if len(first) < rows:
            first.append(item)
    total = sum(per_channel.values())
    counts = ", ".join(f"{name}: {n}" for name, n in sorted(per_channel.items()))
    lines = [f"preview: {notifications(total)} ({counts}); the first {len(first)}:"]
    for item in first:
        deadline = item.payload.get("not_after")
        head = f"  #{item.seq} {item.item_id} → {item.target} via {item.channel}"
        head += f", not after {deadline}" if deadline else ""
        # A reviewer sees which rows will not go out at all.
        lines.append(head + (" (suppressed: never sent)" if item.state == "suppressed" else ""))
        lines.append(f"    subject: {item.payload.get('subject', '')}")
        for n, text in enumerate(str(item.payload.get("body", "")).splitlines() or [""]):
            lines.append(("    body:    " if n == 0 else "             ") + text)
    return Glimpse(lines, total - len(first))


class Watch:
    """A sending run's approval as last read, handed to the run control: at or after its
    expiry no send starts. Read again at each revisit, so `notifier approve` renewing it
    mid-run counts. A run that needs no approval is never expired."""

    def __init__(self, control: RunControl) -> None:
        self.control = control
        self._approved: str | None = None
        self.needed = False  # whether the run needs an approval (known at the first read)

    def read(self, run: Run) -> None:
        """The approval as stored in `run` (its fingerprint and expiry were checked before
        the lease was taken: check_can_send). A record gone, or bound to another fingerprint,
        counts as expired: nothing more is sent."""
        if not requires_approval(run):
            return
        self.needed = True
        current = stored_approval(run)
        if current is None or current.fingerprint != (self._approved or current.fingerprint):
            until = _WITHDRAWN
        else:
            self._approved = current.fingerprint
            until = clock.parse(current.expires_at)
        self.control.expires_at(until, pause_reason(until))


def pause_reason(until: datetime) -> str:
    """Why the run pauses once its approval, good until `until`, no longer holds, beginning
    with APPROVAL_PAUSE."""
    return APPROVAL_PAUSE + (
        " was withdrawn or bound to other content"
        if until == _WITHDRAWN
        else f" expired at {clock.local(clock.iso(until))}"
    )
