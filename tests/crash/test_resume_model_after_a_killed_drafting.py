"""resume --model after drafting was stopped: the new model drafts only the rows not drafted
yet."""

from __future__ import annotations

import signal
from collections import Counter

import pytest

from ..conftest import Workspace, wait_for
from ..engine.test_compose import batch, brief
from ..engine.test_compose_truthful import drafted
from ..fake_messages import FakeMessages

pytestmark = pytest.mark.both_stores


def test_resume_model_changes_the_model_only_for_rows_not_drafted(
    ws: Workspace, fake: FakeMessages
) -> None:
    """After a crash with two rows drafted, `resume --model m-new` says what it changes,
    drafts only the rest with m-new, and the first two keep their model."""
    fake.echo_model = True
    fake.answer_limit = 2
    process = ws.popen("send", str(batch(ws, 5)), "--compose", str(brief(ws)), "--model", "m-old")
    wait_for(lambda: drafted(ws) >= 2, "two drafts stored")
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    mark = len(fake.requests)
    fake.answer_limit = None
    fake.release.set()
    resumed = ws.invoke("resume", "--model", "m-new")
    assert resumed.exit_code == 0, resumed.output
    assert "3 row(s) not drafted yet will be drafted with m-new (was m-old)" in resumed.output
    # A request the killed process had already written may reach the fake after `mark`
    # (with m-old, never answered to anyone): only the resume's own requests are counted.
    assert len([r for r in fake.requests[mark:] if r.body["model"] == "m-new"]) == 3
    models = Counter(d["model"] for d in ws.ledger.drafts())
    assert models == {"m-old": 2, "m-new": 3}
    again = ws.invoke("resume", "--model", "m-x")
    assert again.exit_code == 2 and "no unfinished run" in again.output
