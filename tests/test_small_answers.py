"""Smaller wrong answers (issue 20, item 7): exit codes and messages that told an operator
something untrue — an expired run reported as done, Ctrl-C during planning or a manual
reconcile called an internal error, a missing secret found after the run was stored, an
unusable lease TTL, a dangling --db symlink, and a stop reason left after its cause was
settled."""

from __future__ import annotations

import pytest

from .conftest import Workspace, make_rows


@pytest.mark.both_stores
def test_a_run_whose_items_expired_exits_3_not_0(ws: Workspace) -> None:
    """A send whose every item expired (never sent) exits 3 and says so, not 0."""
    batch = ws.write_csv("b.csv", make_rows(2))
    result = ws.invoke("send", str(batch), "--not-after", "2020-01-01T00:00:00Z")
    assert result.exit_code == 3, result.output
    assert "2 expired" in result.output
    assert ws.outbox_documents() == []
    assert ws.status()["counts"]["expired"] == 2
