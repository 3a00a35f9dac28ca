"""`export` is read-only on the database: it migrates nothing, and reads a database as the
version that wrote it left it. One written before the suppression list (m008) has no
suppression tables, and none of its items was suppressed: its run is exported with no
suppression entry, the file verifies (exit 0), and the database is left as it was, never an
internal error. The committed fixture's run, left in flight by the code before m007 (and so
before m008), on both stores."""

from __future__ import annotations

import json

import pytest

from ..conftest import Workspace

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(90)]
FIXTURE = "m007-inflight-run"
RUN = "m007-fixture"


def test_a_run_from_before_the_suppression_list_is_exported_and_its_file_verifies(
    ws: Workspace,
) -> None:
    ws.load_fixture(FIXTURE)
    before = ws.ledger.migrations()
    assert not any(name.startswith("m008") for name in before), before
    exported = ws.invoke("export", RUN, "--to", "audit.db", "--json")
    assert exported.exit_code == 0, exported.output
    rows = json.loads(exported.output)["rows"]
    assert (rows["suppressions"], rows["suppression_audit"]) == (0, 0), rows
    assert ws.ledger.migrations() == before  # read-only: nothing migrated
    verified = ws.invoke("verify", "audit.db", "--json")
    assert verified.exit_code == 0, verified.output
    document = json.loads(verified.output)
    assert document["findings"] == [], document
    assert [r["verdict"] for r in document["runs"]] == ["unsigned"], document
