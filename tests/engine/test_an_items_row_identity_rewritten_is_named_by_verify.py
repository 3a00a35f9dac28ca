"""An item's row identity (items.identity: what `send` compares a row of a later file with,
channel + `id`, else its content) rewritten behind notifier's back is named by `verify`.
Left unchecked, the ledger verifies keyed while the next `send` of the same file delivers
the row again (its delivered item no longer carries its identity): a change that verify
calls intact, with a second delivery as its effect. Both stores."""

from __future__ import annotations

import pytest

from notifier.domain.verify import AuditVerdict

from ..conftest import Workspace
from ..support.audited import keyed, named, send, verdict

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(120)]
RUN = "first"


@pytest.fixture
def sent(ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> Workspace:
    keyed(monkeypatch)
    send(ws, RUN, 3)
    whole = verdict(ws, RUN)
    assert (whole.verdict, whole.findings) == (AuditVerdict.KEYED, ())
    return ws


def test_an_identity_rewritten_to_another_id_is_named(sent: Workspace) -> None:
    sent.write("UPDATE items SET identity = 'id:zzz' WHERE run_id = ? AND seq = 1", (RUN,))
    found = verdict(sent, RUN)
    assert found.verdict is AuditVerdict.ALTERED
    assert ("items", "item u1 (seq 1)", "differs", "identity") in named(found)


def test_an_identity_rewritten_to_the_items_content_digest_is_named(sent: Workspace) -> None:
    """The form a row of a file without ids has: one row of a run with ids so rewritten
    stands out from its run's other rows."""
    sent.write("UPDATE items SET identity = intent_digest WHERE run_id = ? AND seq = 2", (RUN,))
    found = verdict(sent, RUN)
    assert found.verdict is AuditVerdict.ALTERED
    assert ("items", "item u2 (seq 2)", "differs", "identity") in named(found)
