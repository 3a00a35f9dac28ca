"""`verify` migrates nothing: it reads a database as the version that wrote it left it.
Before m021 a row without an `id` was identified by its intent digest, its deadline and line
breaks included; m021 moves such an identity to the row digest, which leaves them out. A run
of such rows that nobody touched verifies (exit 0, nothing named) before the upgrade as it
does after, never every row named altered for holding the identity its version wrote; and
after the upgrade an identity written back to that earlier form is still named
(tests/engine/test_a_row_without_an_id_is_the_same_row_whatever_its_deadline_or_line_breaks.py).
The committed fixture's run, killed mid-send with a deadline and `\\r\\n` in its bodies, on
both stores."""

from __future__ import annotations

import json

import pytest

from ..conftest import Workspace

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(90)]
FIXTURE = "m021-deadlines-and-crlf"
RUN = "m021-deadlines"
M021 = "m021_rows_without_ids_by_their_row_digest"


def test_a_run_from_before_m021_verifies_before_its_upgrade(ws: Workspace) -> None:
    ws.load_fixture(FIXTURE)
    verified = ws.invoke("verify", RUN, "--json")
    assert M021 not in ws.ledger.migrations()  # read as its version left it
    assert verified.exit_code == 0, verified.output
    (run,) = json.loads(verified.output)["runs"]
    assert (run["verdict"], run["findings"]) == ("unkeyed", []), run
    # After the upgrade as before it.
    resumed = ws.invoke("resume", RUN, "--concurrency", "8")
    assert resumed.exit_code == 0, resumed.output
    assert M021 in ws.ledger.migrations()
    again = ws.invoke("verify", RUN)
    assert again.exit_code == 0, again.output


def test_an_identity_rewritten_before_m021_is_still_named(ws: Workspace) -> None:
    """Before the upgrade an identity must be the one its version wrote: another row's is
    named."""
    ws.load_fixture(FIXTURE)
    ((other,),) = ws.query("SELECT identity FROM items WHERE run_id = ? AND seq = 2", (RUN,))
    ws.write("UPDATE items SET identity = ? WHERE run_id = ? AND seq = 1", (other, RUN))
    verified = ws.invoke("verify", RUN, "--json")
    assert M021 not in ws.ledger.migrations()
    assert verified.exit_code == 5, verified.output
    (run,) = json.loads(verified.output)["runs"]
    assert [(f["row"], f["column"]) for f in run["findings"]] == [("item 1 (seq 1)", "identity")]
