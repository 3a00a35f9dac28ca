"""Fault injection for rehearsals: NOTIFIER_CRASH_AT=POINT:SEQ ends the process at POINT for
item SEQ with status 137, without cleanup, exactly as a kill -9 would."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass

POINTS = ("after-intent", "after-send", "after-receipt")
ENV = "NOTIFIER_CRASH_AT"
EXIT_STATUS = 137


class CrashSpecError(ValueError):
    pass


@dataclass(frozen=True)
class CrashPlan:
    point: str
    seq: int

    def at(self, point: str, seqs: Iterable[int]) -> None:
        """Die here if this is the planned point and the window holds the planned item."""
        if point == self.point and self.seq in seqs:
            sys.stdout.flush()
            print(f"{ENV}: simulated crash {point} item {self.seq}", file=sys.stderr, flush=True)
            os._exit(EXIT_STATUS)


def from_env(environ: dict[str, str] | None = None) -> CrashPlan | None:
    value = (environ if environ is not None else dict(os.environ)).get(ENV, "").strip()
    if not value:
        return None
    point, _, seq = value.partition(":")
    if point not in POINTS or not seq.isdigit() or int(seq) < 1:
        raise CrashSpecError(
            f"{ENV}={value!r} is not POINT:SEQ with POINT one of {', '.join(POINTS)} and SEQ "
            "an item's 1-based position, e.g. after-send:20"
        )
    return CrashPlan(point, int(seq))
