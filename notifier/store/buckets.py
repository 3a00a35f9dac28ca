"""Rate buckets shared by the workers of a run (PostgreSQL), timed on the server's clock."""

from __future__ import annotations

from notifier.store.core import Core
from notifier.store.statements import buckets as sql


class Buckets:
    """A channel's --rate as one token bucket in the database."""

    def __init__(self, core: Core) -> None:
        self.core = core

    def open_bucket(self, run_id: str, channel: str, rate: float) -> None:
        """The bucket of `channel`, full, unless a worker of the run made it already."""
        self.core.engine.execute(
            sql.OPEN_BUCKET, {"run_id": run_id, "channel": channel, "capacity": max(1.0, rate)}
        )

    def take_token(self, run_id: str, channel: str, rate: float) -> bool:
        """Take one token of `channel`'s bucket (see open_bucket; refilled at `rate` per
        second, holding at most max(1, rate)); False when none is left now. One statement,
        atomic on its own: a token is never handed to two workers."""
        cursor = self.core.engine.execute(
            sql.TAKE_TOKEN,
            {"capacity": max(1.0, rate), "rate": float(rate), "run_id": run_id, "channel": channel},
        )
        return bool(cursor.rowcount == 1)
