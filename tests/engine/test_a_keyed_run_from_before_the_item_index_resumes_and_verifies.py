"""Migration m014 (the events indexed by item, which `verify` reads a slice of items at a
time through) on a database written by the code before it, on both engines: the committed
fixture's keyed run, killed mid-send, verifies keyed before the migration (read-only,
nothing migrated) and after it, a few items a slice; it resumes and sends each remaining
item once; and its chain, written before and after the upgrade, still verifies keyed."""

from __future__ import annotations

import pytest

from notifier.domain import verify
from notifier.domain.chain import KEY_ENV
from notifier.domain.verify import AuditVerdict
from notifier.store import Store

from ..conftest import Workspace
from ..support.audited import KEY, verdict

pytestmark = pytest.mark.timeout(120)
RUN = "m014-crashed"


def keyed_whole(ws: Workspace) -> None:
    found = verdict(ws, RUN)
    assert (found.verdict, found.findings) == (AuditVerdict.KEYED, ()), found


@pytest.mark.both_stores
def test_the_killed_keyed_run_verifies_resumes_once_each_and_verifies_again(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """k1-k6 were sent and k7 written before the kill: read three items a slice, the run
    verifies keyed as the code before m014 left it; migrated by a read-write open, it
    verifies the same; resume settles k7 by asking the outbox and sends k8-k12, each once;
    and the whole chain, both codes' events, verifies keyed."""
    ws.load_fixture("m014-keyed-inflight-run")
    monkeypatch.setattr(verify, "CHUNK", 3)
    keyed_whole(ws)
    for reading in ("status", "runs"):  # read-only: the database stays as it was
        assert ws.invoke(reading).exit_code in (0, 3), reading
    Store.open(ws.db).close()
    assert {"m014_events_by_item", "m015_worker_pid_space"} <= set(ws.ledger.migrations())
    keyed_whole(ws)
    resumed = ws.invoke("resume", RUN, env={KEY_ENV: KEY})
    assert resumed.exit_code == 0, resumed.output
    ids = sorted(d["item_id"] for d in ws.outbox_documents())
    assert ids == sorted(f"k{i}" for i in range(1, 13))
    assert ws.ledger.state_counts(RUN) == {"sent": 12}
    keyed_whole(ws)


def test_a_slice_of_items_reads_its_events_through_the_index(ws: Workspace) -> None:
    """(SQLite, whose plan can be read.) The read verify makes for each slice of items
    searches the index, in its order, rather than every
    event of the run (a million-item run: two hundred slices, each reading two million
    events)."""
    ws.load_fixture("m014-keyed-inflight-run")
    Store.open(ws.db).close()
    plan = ws.query(
        "EXPLAIN QUERY PLAN SELECT seq_no, detail FROM events "
        "WHERE run_id = ? AND item_seq >= ? AND item_seq < ? ORDER BY item_seq, seq_no",
        (RUN, 1, 4),
    )
    steps = [str(row[-1]) for row in plan]
    assert any("events_by_item" in step for step in steps), steps
    assert not any("TEMP B-TREE" in step for step in steps), steps  # read in order, no sort
