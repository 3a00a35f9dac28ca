"""An item's deadline is part of what was planned and approved: it is in the payload its
intent digest covers. The engine reads it from the item's `not_after` column (a copy, kept
so that a claim finds due deadlines through an index; never written again), so an editor
without the key who clears that column has an item sent after the deadline it was approved
with, and one who moves it earlier has it expire unsent, while its payload, digest, the
run's fingerprint and every event are as written. `verify` must name the item, not call
the run keyed. Both stores, against a run awaiting approval, every item still pending."""

from __future__ import annotations

from pathlib import Path

import pytest

from notifier.api import Notifier
from notifier.channels.scripted import Channels, ScriptedChannel, always_deliver
from notifier.domain.verify import AuditVerdict

from ..conftest import Workspace
from ..support.audited import TOML, config, keyed, named, verdict

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(120)]
RUN = "deadlines"
DEADLINE = "2099-01-01T00:00:00+00:00"


def plan(ws: Workspace) -> None:
    rows = [["id", "to", "subject", "body", "not_after"]]
    rows += [[f"u{i}", f"user{i}@example.com", "Sale", "Ends tonight", DEADLINE] for i in (1, 2, 3)]
    batch = ws.write_csv(f"{RUN}.csv", rows)
    channel = ScriptedChannel("hooks", always_deliver, idempotent=False, queryable=False)
    notifier = Notifier.open(ws.db, config=config(), channels=Channels(hooks=channel))
    notifier.send(Path(batch.name), channel="hooks", run_id=RUN, require_approval=True)
    (ws.path / "notifier.toml").write_text(TOML)


def test_an_items_deadline_cleared_or_moved_behind_its_payload_is_named(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    keyed(monkeypatch)
    plan(ws)
    whole = verdict(ws, RUN)
    assert (whole.verdict, whole.findings) == (AuditVerdict.KEYED, ()), whole
    stored = ws.query("SELECT seq, not_after FROM items WHERE run_id = ? ORDER BY seq", (RUN,))
    assert [str(d).startswith("2099-01-01") for _, d in stored] == [True] * 3, stored
    rewrite = "UPDATE items SET not_after = ? WHERE run_id = ? AND seq = ?"
    ws.write(rewrite, (None, RUN, 2))  # sent whenever, its deadline gone
    ws.write(rewrite, ("2000-01-01T00:00:00+00:00", RUN, 3))  # expires unsent
    found = verdict(ws, RUN)
    assert found.verdict is AuditVerdict.ALTERED, found
    assert named(found) == {
        ("items", "item u2 (seq 2)", "differs", "not_after"),
        ("items", "item u3 (seq 3)", "differs", "not_after"),
    }, found
    checked = ws.invoke("verify", RUN)
    assert checked.exit_code == 5, checked.output
    assert "items: item u2 (seq 2): not_after is None" in checked.output, checked.output
