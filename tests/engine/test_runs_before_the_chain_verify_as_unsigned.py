"""Migration m013 (the event chain) on a database written by the code before it, on both
engines: the committed fixture's runs (completed, killed mid-run, settled by hand) open,
verify as unsigned, not altered, and go on: the killed run resumes and sends each of its
remaining items once, its later events staying unchained as the run began; a run sent
after the upgrade on the same database is chained and verifies."""

from __future__ import annotations

import pytest

from notifier.domain.chain import KEY_ENV
from notifier.domain.verify import AuditVerdict
from notifier.store import Store

from ..conftest import Workspace, make_rows
from ..support.audited import KEY, SIGNER, verdict, verdicts

pytestmark = pytest.mark.both_stores
RUNS = ("m013-done", "m013-crashed", "m013-manual")


def test_the_runs_before_the_chain_verify_as_unsigned_not_altered(ws: Workspace) -> None:
    """Read as the code before m013 left them (verify, read-only, migrates nothing), then
    migrated by a read-write open: with the key and without, every run is unsigned and
    nothing is named; the command says so and exits 0."""
    ws.load_fixture("m013-unchained-runs")
    unsigned = {run: (AuditVerdict.UNSIGNED, ()) for run in RUNS}
    for migrated in (False, True):
        if migrated:
            Store.open(ws.db).close()
            assert "m013_event_chain" in ws.ledger.migrations()
        for found in (verdicts(ws), verdicts(ws, SIGNER)):
            assert {run: (v.verdict, v.findings) for run, v in found.items()} == unsigned
        result = ws.invoke("verify", env={KEY_ENV: KEY})
        assert result.exit_code == 0, result.output
        assert result.output.count(": unsigned") == len(RUNS)


def test_the_killed_run_resumes_and_stays_unsigned(ws: Workspace) -> None:
    """c1-c4 were sent and c5 written before the kill: resume settles c5 by asking the
    outbox and sends c6-c8, each once; the run's new events carry no hash (a run is
    chained from its first event or not at all), and it still verifies as unsigned."""
    ws.load_fixture("m013-unchained-runs")
    resumed = ws.invoke("resume", "m013-crashed", env={KEY_ENV: KEY})
    assert resumed.exit_code == 0, resumed.output
    ids = [d["item_id"] for d in ws.outbox_documents() if d["item_id"].startswith("c")]
    assert sorted(ids) == sorted(f"c{i}" for i in range(1, 9))
    assert ws.query(
        "SELECT COUNT(*) FROM events WHERE run_id = 'm013-crashed' AND hash IS NOT NULL"
    ) == [(0,)]
    found = verdict(ws, "m013-crashed")
    assert (found.verdict, found.findings) == (AuditVerdict.UNSIGNED, ())


def test_a_run_sent_after_the_upgrade_is_chained_and_verifies(ws: Workspace) -> None:
    ws.load_fixture("m013-unchained-runs")
    ws.write_csv("new.csv", make_rows(3, start=50))
    sent = ws.invoke("send", "new.csv", "--channel", "files", "--run-id", "m013-after",
                     env={KEY_ENV: KEY})  # fmt: skip
    assert sent.exit_code == 0, sent.output
    found = verdict(ws, "m013-after")
    assert (found.verdict, found.findings) == (AuditVerdict.KEYED, ())
    assert verdict(ws, "m013-done").verdict is AuditVerdict.UNSIGNED
