"""Adversarial review: a file sent again while its rows are open in a run still awaiting
approval is refused (exit 2), rightly. The refusal's advice must name a step that works for
that run: `notifier resume RUN` is refused (exit 4) for a run awaiting approval, so advising
"Continue that run with `notifier resume RUN`" sends the operator to a dead end."""

from __future__ import annotations

import re

import pytest

from ..conftest import Workspace, make_rows

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(60)]


def test_the_refusal_for_rows_open_in_a_run_awaiting_approval_names_no_resume_that_is_refused(
    ws: Workspace,
) -> None:
    ws.write_csv("b.csv", make_rows(3))
    planned = ws.invoke("send", "b.csv", "--require-approval")
    assert planned.exit_code == 0, planned.output
    (run,) = ws.ledger.runs()
    assert run.state == "awaiting_approval"
    again = ws.invoke("send", "b.csv", "--require-approval")
    assert again.exit_code == 2, again.output
    advised = re.findall(r"`notifier resume ([^`]+)`", again.output)
    for args in advised:
        followed = ws.invoke("resume", *args.split())
        assert followed.exit_code != 4, (
            f"the refusal advised `notifier resume {args}`: {again.output!r}; followed, it "
            f"was refused: {followed.output!r}"
        )
