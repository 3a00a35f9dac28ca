"""`export` of a run whose database holds text that is not UTF-8 (a bad disk, SQLite's CAST)
is never an internal error (exit 1): `verify` names such a run altered (exit 5), and the
export refuses it as any command meeting such a cell does (exit 4, the file damaged,
naming `verify`), with no file left at --to. SQLite only: PostgreSQL refuses such text."""

from __future__ import annotations

import pytest

from notifier.domain.chain import KEY_ENV

from ..conftest import Workspace, make_rows
from ..support.audited import KEY

pytestmark = pytest.mark.timeout(120)
ENV = {KEY_ENV: KEY}
NOT_UTF8 = "CAST(X'ff41' AS TEXT)"  # the byte 0xff then 'A': no UTF-8 text
KEY_OF_2 = "(SELECT idempotency_key FROM items WHERE run_id = 'r1' AND seq = 2)"


@pytest.fixture
def sent(ws: Workspace) -> Workspace:
    ws.write_csv("b.csv", make_rows(4))
    assert ws.invoke("send", "b.csv", "--run-id", "r1", env=ENV).exit_code == 0
    return ws


@pytest.mark.parametrize(
    "edit",
    [
        f"UPDATE receipts SET evidence = {NOT_UTF8} WHERE idempotency_key = {KEY_OF_2}",
        f"UPDATE events SET detail = {NOT_UTF8} WHERE run_id = 'r1' AND seq_no = 3",
    ],
    ids=["receipt_evidence", "event_detail"],
)
def test_an_export_of_such_a_run_is_refused_as_damaged_never_an_internal_error(
    sent: Workspace, edit: str
) -> None:
    sent.write(edit)
    assert sent.invoke("verify", "r1", env=ENV).exit_code == 5
    result = sent.invoke("export", "r1", "--to", "audit.db", env=ENV)
    assert "internal error" not in result.output, result.output
    assert result.exit_code == 4, result.output
    assert "not UTF-8" in result.output and "notifier verify" in result.output, result.output
    assert not (sent.path / "audit.db").exists()
