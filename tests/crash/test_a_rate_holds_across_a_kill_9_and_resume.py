"""`--rate` across a kill -9 (docs/guarantees.md "A rate is the run's, not a process's"): a
resume after a kill starts its buckets with only what the rate refilled since the run's
last request that may have left. An attempt left open by the kill holds the time of its
claim, not the moment its request left: at N = 1 the --rate wait comes after the claim, so
the request left a whole token later, and it counts as the moment the run is taken up.
Requests closer together than the rate allows fail it; a loaded machine only spaces them
further apart."""

from __future__ import annotations

import itertools

import pytest

from ..conftest import Workspace, make_rows
from ..receiver import Receiver, receiving, webhook_config

pytestmark = pytest.mark.both_stores

RATE = 0.25  # one send per 4 s, a burst of 1


@pytest.mark.timeout(120)
def test_a_resume_after_a_kill_mid_rate_sends_no_sooner_than_the_rate(ws: Workspace) -> None:
    receiver = Receiver()
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(receiver, idempotent=True, status=True)
        )
        ws.write_csv("batch.csv", make_rows(3))
        # Item 1 goes at once (a full bucket); item 2 is claimed, waits 4 s for its token,
        # leaves, and the process dies before its receipt is recorded (kill -9).
        first = ws.run(
            "send", "batch.csv", "--channel", "hooks", "--rate", str(RATE),
            "--max-wait", "30", env={"NOTIFIER_CRASH_AT": "after-send:2"},
        )  # fmt: skip
        assert first.returncode == 137, first.stderr
        assert len(receiver.arrivals) == 2
        resumed = ws.run("resume", "--max-wait", "30")
        assert resumed.returncode == 0, resumed.stderr
        walls = [a.wall for a in receiver.arrivals]
        gaps = [b - a for a, b in itertools.pairwise(walls)]
        assert min(gaps) >= 0.9 / RATE, (
            f"requests {gaps} s apart at --rate {RATE} (one per {1 / RATE:.0f} s)"
        )
