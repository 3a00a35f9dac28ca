"""Rate buckets shared by the workers of a run (PostgreSQL), timed on the server's clock."""

from __future__ import annotations

from .core import Core


class Buckets:
    """A channel's --rate as one token bucket in the database."""

    def __init__(self, core: Core) -> None:
        self.core = core

    def open_bucket(self, run_id: str, channel: str, rate: float) -> None:
        """The bucket of `channel`, full, unless a worker of the run made it already."""
        self.core.conn.execute(
            "INSERT INTO rate_buckets (run_id, channel, tokens, refilled_at) VALUES "
            f"(?, ?, CAST(? AS DOUBLE PRECISION), {self.core.dialect.now_s}) "
            "ON CONFLICT DO NOTHING",
            (run_id, channel, max(1.0, rate)),
        )

    def take_token(self, run_id: str, channel: str, rate: float) -> bool:
        """Take one token of `channel`'s bucket (see open_bucket; refilled at `rate` per
        second, holding at most max(1, rate)); False when none is left now. One statement,
        atomic on its own: a token is never handed to two workers."""
        capacity = max(1.0, rate)
        least, now_s = self.core.dialect.least, self.core.dialect.now_s
        refilled = f"{least}(:capacity, tokens + ({now_s} - refilled_at) * :rate)"
        cursor = self.core.conn.execute(
            f"UPDATE rate_buckets SET tokens = {refilled} - 1, refilled_at = {now_s} "
            f"WHERE run_id = :run_id AND channel = :channel AND {refilled} >= 1",
            {"capacity": capacity, "rate": float(rate), "run_id": run_id, "channel": channel},
        )
        return bool(cursor.rowcount == 1)
