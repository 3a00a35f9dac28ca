"""What names an item, its row id and its idempotency key, is covered by the run's chain as
its content is: the plan (or a composed run's freeze) chains a digest of every item's id and
key (intent.Identities), and `verify` names a key rewritten (a resume would send the row
under a key its receiver never saw, so that it may arrive twice) or two rows' ids swapped
(the record would say the one row was delivered where the other was), in the database and
in an export taken after the edit. Both stores, a run sent under the audit key."""

from __future__ import annotations

import pytest

from notifier.api import Notifier
from notifier.channels.scripted import DELIVER, LOST_AFTER_COMMIT, Response
from notifier.domain.intent import Intent
from notifier.domain.verify import AuditVerdict

from ..conftest import Workspace
from ..support.audited import TOML, config, keyed, named, send, verdict

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(120)]
RUN = "audited"
NAMED = ("items", "the run's items", "differs", "item_id, idempotency_key")


def lose_2(intent: Intent, tries: int) -> Response:
    return LOST_AFTER_COMMIT if intent.seq == 2 else DELIVER


@pytest.fixture
def run(ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> Workspace:
    keyed(monkeypatch)
    send(ws, RUN, 4, lose_2)  # u2 unknown: its key is what a resume would send it under
    (ws.path / "notifier.toml").write_text(TOML)
    whole = verdict(ws, RUN)
    assert (whole.verdict, whole.findings) == (AuditVerdict.KEYED, ())
    return ws


def _named_in_the_database_and_its_export(ws: Workspace) -> None:
    found = verdict(ws, RUN)
    assert found.verdict is AuditVerdict.ALTERED, found
    assert NAMED in named(found), found
    to = ws.path / "audit.db"
    Notifier.open(ws.db, config=config()).export(RUN, to)  # seals the rewritten rows
    checked = Notifier.open(ws.path / "elsewhere.db", config=config()).verify_export(to)
    assert [v.verdict for v in checked.runs] == [AuditVerdict.ALTERED], checked
    assert any(NAMED in named(v) for v in checked.runs), checked


def test_an_items_idempotency_key_rewritten_is_named(run: Workspace) -> None:
    run.write(
        "UPDATE items SET idempotency_key = 'ntf1-forged' WHERE run_id = ? AND seq = 2", (RUN,)
    )
    _named_in_the_database_and_its_export(run)


def test_two_items_ids_swapped_are_named(run: Workspace) -> None:
    """u2 (unknown) and u3 (sent) trade ids: the record would say row u2 was delivered."""
    run.write("UPDATE items SET item_id = 'tmp' WHERE run_id = ? AND seq = 2", (RUN,))
    run.write("UPDATE items SET item_id = 'u2' WHERE run_id = ? AND seq = 3", (RUN,))
    run.write("UPDATE items SET item_id = 'u3' WHERE run_id = ? AND seq = 2", (RUN,))
    _named_in_the_database_and_its_export(run)
