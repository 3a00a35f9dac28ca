"""`--max-wait` is the longest a run waits in one process before it pauses (a start time, a
send window, a Retry-After, a `--rate` token). NaN compares false with every wait, so a run
given `--max-wait nan` never pauses: it holds its lease and its process for as long as the
wait is (years, for a `--not-before` years ahead) instead of pausing at once, exit 3. It is
bad input: exit 2 naming the option, nothing stored (send) or touched (resume)."""

from __future__ import annotations

import pytest

from ..conftest import Workspace, make_rows

pytestmark = [pytest.mark.timeout(30), pytest.mark.both_stores]


@pytest.mark.parametrize("command", ["send", "resume", "worker"])
def test_a_max_wait_of_nan_exits_2_naming_the_option(ws: Workspace, command: str) -> None:
    batch = ws.write_csv("b.csv", make_rows(2))
    later = ["--not-before", "2099-01-01T00:00:00Z"]
    if command == "send":
        result = ws.invoke("send", str(batch), *later, "--max-wait", "nan")
        assert not ws.has_database() or ws.ledger.runs() == []
    else:
        if command == "worker" and not ws.url:
            pytest.skip("`notifier worker` shares a run through PostgreSQL")
        assert ws.invoke("send", str(batch), *later, "--max-wait", "0").exit_code == 3
        before = [(i.item_id, i.state) for i in ws.ledger.items()]
        result = ws.invoke(command, "--max-wait", "nan")
        assert [(i.item_id, i.state) for i in ws.ledger.items()] == before
    assert result.exit_code == 2, result.output
    assert "--max-wait" in result.output and "Traceback" not in result.output, result.output
    assert ws.outbox_documents() == []
