"""A report is one moment of the ledger: its counts, its pending detail and every item it
lists agree with each other, also while a run is live and its items change between the
report's reads. A `report --json` taken while a worker records sends must never say
`"in_flight": 12` above twelve items listed `sent`, nor count a negative number of pending
items never attempted. Here a live run at concurrency 8 (its requests held by the receiver)
moves on exactly after the report has read its counts: the receiver answers and the worker
records every send before the report reads its items. The report (`report --json`, `status
--json`) shows the run as it stood at one moment, throughout. Both stores."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from notifier.ops import report
from notifier.store.drafts import run_counts

from ..conftest import Workspace, make_rows, wait_for
from ..receiver import HoldAfter, Receiver, receiving, webhook_config

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(120)]

N = 8
ROWS = N + 4


@pytest.mark.parametrize("command", [["report", "r1", "--json"], ["status", "r1", "--json"]])
def test_a_report_taken_while_the_run_moves_counts_the_items_it_lists(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    hold = HoldAfter(0)  # every request held until set
    receiver = Receiver(hold=hold)
    moved: list[str] = []
    counts: Callable[..., Any] = run_counts

    def counts_then_the_run_moves(*args: Any, **kwargs: Any) -> Any:
        read = counts(*args, **kwargs)
        if not moved:
            hold.set()
            wait_for(lambda: ws.ledger.state_counts() == {"sent": ROWS}, "every row recorded")
            moved.append("sent")
        return read

    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(receiver, idempotent=True, status=True)
        )
        ws.write_csv("batch.csv", make_rows(ROWS))
        process = ws.popen(
            "send", "batch.csv", "--channel", "hooks", "--run-id", "r1",
            "--concurrency", str(N),
        )  # fmt: skip
        try:
            receiver.wait_for(lambda r: len(r.arrivals) == N)  # live: N requests under way
            monkeypatch.setattr(report, "run_counts", counts_then_the_run_moves)
            result = ws.invoke(*command)
            out, err = process.communicate(timeout=60)
        finally:
            hold.set()
            if process.poll() is None:
                process.kill()
                process.communicate()
    assert process.returncode == 0, out + err
    assert result.exit_code == 0, result.output
    assert moved == ["sent"]  # the run did move between the report's reads
    data = json.loads(result.stdout)
    listed = Counter(item["state"] for item in data["items"])
    taken = data["counts"]
    assert {s: n for s, n in taken.items() if n and s != "total"} == dict(listed), data
    assert taken["total"] == sum(listed.values()) == ROWS
    assert taken["sent"] == 0, taken  # the moment the report was asked for: none answered
    assert all(n >= 0 for n in data["pending_detail"].values()), data
    assert taken["pending"] == sum(data["pending_detail"].values()), data
