"""`status`, `report`, `runs` and `metrics` count a run's items from its per-run counters
(run_counts, kept with every move), never from its item rows. An editor without the key who
rewrites those counters (an unknown item counted as sent) changes what every one of them
reports, while every item, attempt, receipt and event is as written: `verify` must not call
such a run keyed ("the rows are what the events say") while its reports disagree with its
rows. Both stores, against a run sent under the audit key whose u2 lost its answer."""

from __future__ import annotations

import pytest

from notifier.channels.scripted import DELIVER, LOST_AFTER_COMMIT, Response
from notifier.domain.intent import Intent
from notifier.domain.verify import AuditVerdict

from ..conftest import Workspace
from ..support.audited import TOML, keyed, send, verdict

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(120)]
RUN = "counted"


def lose_2(intent: Intent, tries: int) -> Response:
    return LOST_AFTER_COMMIT if intent.seq == 2 else DELIVER


def test_an_unknown_item_counted_as_sent_in_the_counters_is_named(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    keyed(monkeypatch)
    send(ws, RUN, 4, lose_2)
    (ws.path / "notifier.toml").write_text(TOML)
    whole = verdict(ws, RUN)
    assert (whole.verdict, whole.findings) == (AuditVerdict.KEYED, ()), whole
    assert ws.status()["counts"]["unknown"] == 1
    move = "UPDATE run_counts SET n = n + ? WHERE run_id = ? AND state = ?"
    ws.write(move, (-1, RUN, "unknown"))
    ws.write(move, (1, RUN, "sent"))
    try:
        # Every report now says the run delivered everything, none unknown.
        counts = ws.status()["counts"]
        assert (counts["sent"], counts["unknown"]) == (4, 0), counts
        assert [i.state for i in ws.ledger.items(RUN)].count("unknown") == 1
        found = verdict(ws, RUN)
        assert found.verdict is AuditVerdict.ALTERED, found
        checked = ws.invoke("verify", RUN)
        assert checked.exit_code == 5, checked.output
    finally:
        # As the items say again (the suite checks the counters after every test).
        ws.write(move, (1, RUN, "unknown"))
        ws.write(move, (-1, RUN, "sent"))
