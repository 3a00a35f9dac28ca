"""Fault injection for rehearsals: NOTIFIER_CRASH_AT=POINT:SEQ ends the process at POINT for
item SEQ with status 137, without cleanup, exactly as a kill -9 would.
NOTIFIER_FREEZE_AT=POINT:SEQ instead stops the process there with SIGSTOP (a paused container,
a VM stall); it carries on from that point when it gets SIGCONT."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterable
from dataclasses import dataclass

from notifier.domain.errors import BadInput, ExitCode, NextStep
from notifier.domain.state_machine import ItemState

POINTS = ("after-intent", "after-send", "after-receipt")
# Drafting through Message Batches: after a chunk's intent is stored and after its
# batch is created (SEQ: the chunk's number), after a result is stored (SEQ: the row's seq).
DRAFT_POINTS = ("after-chunk-intent", "after-batch-create", "mid-stream")
ENV = "NOTIFIER_CRASH_AT"
FREEZE_ENV = "NOTIFIER_FREEZE_AT"
EXIT_STATUS = int(ExitCode.CRASHED)
# Item states a run never sends from again: a rehearsal at one of these cannot fire.
_SETTLED = frozenset({ItemState.SENT, ItemState.FAILED, ItemState.EXPIRED, ItemState.SUPPRESSED})


class CrashSpecError(BadInput):
    """A mistyped rehearsal variable: a usage error before anything is stored."""


@dataclass(frozen=True)
class CrashPlan:
    point: str
    seq: int
    freeze: bool = False  # SIGSTOP instead of dying

    def check_fires(self, items: int, what: str) -> None:
        """CrashSpecError when this point names an item beyond the `items` of `what`: the
        rehearsal would never fire and the run would look like it passed."""
        if self.point in POINTS and self.seq > items:
            name = FREEZE_ENV if self.freeze else ENV
            raise CrashSpecError(
                f"{name}={self.point}:{self.seq} cannot fire: {what} has {items} item(s), so "
                f"there is no item {self.seq}. Give a position from 1 to {items}, e.g. "
                f"{self.point}:{max(1, items // 2)}; nothing was stored."
            )

    def check_planned(self, state: ItemState | None, what: str) -> None:
        """CrashSpecError when the item this point names is not one the run will send: `state`
        is its state as just stored (None: not planned, an earlier run delivered that row),
        `suppressed` never sent. The rehearsal would never fire and the run would look like
        it passed."""
        if self.point not in POINTS or state is ItemState.PENDING:
            return
        why = (
            "its recipient is suppressed (stored, never sent)"
            if state is ItemState.SUPPRESSED
            else "it is not planned (an earlier run delivered that row with the same content)"
            if state is None
            else f"it is {state.value}"
        )
        raise CrashSpecError(
            f"{self._name}={self.point}:{self.seq} cannot fire: item {self.seq} of {what} will "
            f"not be sent, as {why}. Give the position of a row this run sends; nothing was "
            "stored."
        )

    def check_reachable(self, state: ItemState | None, run_id: str) -> None:
        """CrashSpecError when `resume` (or a worker) cannot reach this point: run `run_id`
        has no item SEQ (`state` None), or that item is settled and never sent again."""
        if self.point not in POINTS or (state is not None and state not in _SETTLED):
            return
        why = (
            f"it has no item {self.seq}"
            if state is None
            else f"its item {self.seq} is {state.value}"
        )
        raise CrashSpecError(
            f"{self._name}={self.point}:{self.seq} cannot fire: run {run_id} never sends that "
            f"item again, as {why}. Give the position of an item it still has to send; nothing "
            "was changed."
        ).advise(NextStep.LIST_PENDING, run_id)

    @property
    def _name(self) -> str:
        return FREEZE_ENV if self.freeze else ENV

    def at(self, point: str, seqs: Iterable[int]) -> None:
        """Die (or freeze) here if this is the planned point and the window holds the item."""
        if point == self.point and self.seq in seqs and self.freeze:
            sys.stdout.flush()
            print(f"{FREEZE_ENV}: frozen {point} item {self.seq}", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
            return
        if point == self.point and self.seq in seqs:
            sys.stdout.flush()
            print(f"{ENV}: simulated crash {point} item {self.seq}", file=sys.stderr, flush=True)
            os._exit(EXIT_STATUS)


def from_env(environ: dict[str, str] | None = None) -> CrashPlan | None:
    env = environ if environ is not None else dict(os.environ)
    crash_value = env.get(ENV, "").strip()
    freeze_value = env.get(FREEZE_ENV, "").strip()
    if crash_value and freeze_value:
        raise CrashSpecError(f"set {ENV} or {FREEZE_ENV}, not both: one rehearsal at a time")
    name, value = (FREEZE_ENV, freeze_value) if freeze_value else (ENV, crash_value)
    if not value:
        return None
    point, _, seq = value.partition(":")
    if point not in POINTS + DRAFT_POINTS or not (seq.isascii() and seq.isdigit()) or int(seq) < 1:
        raise CrashSpecError(
            f"{name}={value!r} is not POINT:SEQ with POINT one of "
            f"{', '.join(POINTS + DRAFT_POINTS)} and SEQ "
            "an item's 1-based position, e.g. after-send:20"
        )
    return CrashPlan(point, int(seq), freeze=name == FREEZE_ENV)
