"""A receipt records the digest of the intent it proves delivered (copied from its item as
it is stored, never written otherwise): every open of the database refuses one that holds
another digest ("a receipt for a different digest"). An editor without the key who rewrites
that digest leaves every item, attempt, event and the receipt's id, source and evidence as
written: `verify` must name the receipt, not call the run keyed ("the rows are what the
events say") while the store refuses to work on it. Both stores, in the database; an
export holds no receipt digest (its receipts are the item's, by seq)."""

from __future__ import annotations

import pytest

from notifier.domain.verify import AuditVerdict

from ..conftest import Workspace
from ..support.audited import TOML, keyed, named, send, verdict

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(120)]
RUN = "received"
FORGED = "sha256:" + "0" * 64


def test_a_receipt_given_another_intents_digest_is_named(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    keyed(monkeypatch)
    send(ws, RUN, 3)
    (ws.path / "notifier.toml").write_text(TOML)
    whole = verdict(ws, RUN)
    assert (whole.verdict, whole.findings) == (AuditVerdict.KEYED, ()), whole
    ((key, digest),) = ws.query(
        "SELECT idempotency_key, intent_digest FROM items WHERE run_id = ? AND seq = 2", (RUN,)
    )
    rewrite = "UPDATE receipts SET intent_digest = ? WHERE idempotency_key = ?"
    ws.write(rewrite, (FORGED, key))
    try:
        # The store itself will not work on it any more.
        refused = ws.invoke("report", RUN)
        assert refused.exit_code != 0 and "different digest" in refused.output, refused.output
        found = verdict(ws, RUN)
        assert found.verdict is AuditVerdict.ALTERED, found
        assert named(found) == {
            ("receipts", "receipt of item u2 (seq 2)", "differs", "intent_digest")
        }, found
        (difference,) = found.findings
        assert (difference.stored, difference.expected) == (FORGED, digest)
        checked = ws.invoke("verify", RUN)
        assert checked.exit_code == 5, checked.output
        assert "receipts: receipt of item u2 (seq 2): intent_digest" in checked.output
    finally:
        ws.write(rewrite, (digest, key))  # the suite opens the store after every test
