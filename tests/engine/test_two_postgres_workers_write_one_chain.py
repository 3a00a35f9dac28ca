"""Two workers sending one PostgreSQL run side by side write one chain: their events are
numbered and linked in the order their transactions committed, each after the one really
before it (the run's row, taken at COMMIT, orders them; no schema-wide lock), and the run
verifies under the key with its rows equal to their replay."""

from __future__ import annotations

from pathlib import Path

import pytest

from notifier.api import Notifier
from notifier.channels.scripted import Channels, Kind, Response, ScriptedChannel
from notifier.domain.intent import Intent
from notifier.domain.verify import AuditVerdict

from ..conftest import Workspace, make_rows
from ..support.audited import config, keyed, verdict
from ..support.background import Worker

pytestmark = pytest.mark.timeout(180)
ROWS = 200


@pytest.mark.parametrize("ws", ["postgres"], indirect=True)
def test_two_workers_on_one_run_write_one_chain_that_verifies(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    keyed(monkeypatch)

    def slow(intent: Intent, tries: int) -> Response:
        return Response(Kind.DELIVER, latency=0.01)  # long enough for both to take turns

    channel = ScriptedChannel("hooks", slow, idempotent=False, queryable=False)
    ws.write_csv("batch.csv", make_rows(ROWS))
    notifier = Notifier.open(ws.db, config=config(), channels=Channels(hooks=channel))
    planned = notifier.plan(Path("batch.csv"), channel="hooks", run_id="shared")
    assert planned.run is not None
    workers = [
        Worker(lambda: notifier.work("shared", concurrency=8, joining=True)) for _ in range(2)
    ]
    for worker in workers:
        worker.result(timeout=150)
    sent_by = [(len({i.worker_id for i in ws.ledger.items("shared")}),)]
    assert sent_by == [(2,)], "both workers must have sent for the chain to interleave"
    assert ws.ledger.state_counts() == {"sent": ROWS}
    found = verdict(ws, "shared")
    assert (found.verdict, found.findings) == (AuditVerdict.KEYED, ())
    assert found.events == max(ws.ledger.event_numbers("shared"))
