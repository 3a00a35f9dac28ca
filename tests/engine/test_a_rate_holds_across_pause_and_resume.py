"""`--rate` is a rule of the run, not of one process: a run paused because its next send
was further away than --max-wait says it is paused until that send is allowed, and a
`resume` (or a Ctrl-C and a resume, or a kill -9 and a resume) before then sends nothing
sooner than the rate allows. On PostgreSQL the bucket lives in the database
(rate_buckets) and outlives the process; on SQLite it must too."""

from __future__ import annotations

import pytest

from notifier.domain import clock

from ..conftest import Workspace, make_rows
from ..receiver import Receiver, receiving, webhook_config

pytestmark = pytest.mark.both_stores


@pytest.mark.parametrize("n", [1, 8])
@pytest.mark.timeout(90)
def test_a_resume_before_the_rate_allows_the_next_send_sends_nothing(ws: Workspace, n: int) -> None:
    """`--rate 0.001` (one send per 1000 s) with `--max-wait 5`: the first send goes, the
    run pauses (exit 3) until the rate allows the next, 1000 s away. Resumed at once, it
    sends nothing more and pauses again: the recipient got one notification, not two in a
    second."""
    receiver = Receiver()
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(receiver, idempotent=True, status=True)
        )
        ws.write_csv("batch.csv", make_rows(5))
        first = ws.invoke(
            "send", "batch.csv", "--channel", "hooks", "--concurrency", str(n),
            "--rate", "0.001", "--max-wait", "5",
        )  # fmt: skip
        assert first.exit_code == 3, first.output
        assert len(receiver.arrivals) == 1
        until = clock.parse(str(ws.ledger.run().paused_until))
        assert (until - clock.now()).total_seconds() > 900
        resumed = ws.invoke("resume", "--max-wait", "5")
        assert resumed.exit_code == 3, resumed.output
        assert len(receiver.arrivals) == 1, (
            f"{len(receiver.arrivals)} sends within seconds at --rate 0.001"
        )
