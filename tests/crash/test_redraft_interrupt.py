"""Ctrl-C during `notifier redraft` keeps the answers already received (they are paid for),
as `send --compose` does: no new request after it, the requests in flight are waited for,
their drafts stored as one redraft; the rows never asked keep their draft, and the command
the tool names for them redrafts only those. The real CLI in a subprocess, against the fake
Messages API, on both stores."""

from __future__ import annotations

import re
import signal
from collections import Counter
from typing import Any

import pytest

from ..conftest import Workspace, wait_for
from ..engine.test_redraft import awaiting, run_fingerprint
from ..fake_messages import Canned, FakeMessages, tool_answer

pytestmark = pytest.mark.both_stores


def fresh(row: dict[str, Any], model: str = "claude-test-1") -> Canned:
    return tool_answer(f"Fresh {row.get('id')}", "A new body.", model)


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_during_redraft_keeps_the_answers_received_and_asks_only_the_rest(
    ws: Workspace, fake: FakeMessages, signum: signal.Signals, status: int
) -> None:
    """Redrafting 8 rows, 4 at a time: 2 answered, 4 held by the API, 2 not asked yet when
    Ctrl-C (or SIGTERM) comes. Exit 130 (143); the 6 answers (the 4 held ones waited for)
    are stored as new drafts, the fingerprint follows, the 2 rows never asked keep their
    draft and no request is made for them; the command named for them asks for those 2."""
    old = awaiting(ws, fake, 8)
    every = [f"u{i}" for i in range(1, 9)]
    mark = len(fake.requests)
    fake.default = fresh  # type: ignore[method-assign]
    fake.answer_limit = mark + 2
    fake.answer_held = True
    args = ["redraft", *(a for i in every for a in ("--item", i))]
    process = ws.popen(*args)
    wait_for(lambda: fake.held == 4 and len(fake.requests) == mark + 6, "2 answered, 4 held")
    process.send_signal(signum)
    assert process.stdout is not None
    # The held answers go only once the Ctrl-C was taken (else the 2 left would be asked).
    while (line := process.stdout.readline()) and "while redrafting" not in line:
        pass
    fake.release.set()
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == status, (stdout, stderr)
    asked = [r.row_id for r in fake.requests[mark:]]
    assert len(asked) == 6 and len(set(asked)) == 6, asked  # nothing asked after Ctrl-C
    left = sorted(set(every) - set(asked))
    subjects = {d["source"]: d["subject"] for d in ws.ledger.drafts()}
    by_id = {re.search(r'"item_id": "(u\d)"', s).group(1): v for s, v in subjects.items()}  # type: ignore[union-attr]
    assert {i: by_id[i] for i in asked} == {i: f"Fresh {i}" for i in asked}
    assert {i: by_id[i] for i in left} == {i: f"Draft {i}" for i in left}
    assert run_fingerprint(ws) != old
    assert "6 row(s) redrafted" in stderr, stderr
    suggested = f"notifier redraft {ws.ledger.run().run_id}"
    suggested += "".join(f" --item {i}" for i in left)
    assert suggested in stderr, stderr

    mark = len(fake.requests)
    fake.answer_limit = None
    again = ws.invoke(*suggested.split()[1:])
    assert again.exit_code == 0, again.output
    assert Counter(r.row_id for r in fake.requests[mark:]) == dict.fromkeys(left, 1)
    assert all(d["subject"].startswith("Fresh ") for d in ws.ledger.drafts())
