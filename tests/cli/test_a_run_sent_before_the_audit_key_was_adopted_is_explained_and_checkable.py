"""A database that adopted the audit key after some runs were sent holds runs chained
without one. Checked with the key, such a run cannot be told from a keyed run an editor
rewrote without it (`verify` exits 5 naming it, as docs/guarantees.md says); the finding says
both readings, and the check that applies to the honest one, followed (`verify RUN` without
the key), reports it `unkeyed`, exit 0. Both stores."""

from __future__ import annotations

import pytest

from notifier.domain.chain import KEY_ENV

from ..conftest import Workspace, make_rows
from ..support.audited import KEY

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(60)]


def test_a_run_sent_before_the_key_is_named_with_both_readings_and_checks_unkeyed_without_it(
    ws: Workspace,
) -> None:
    ws.write_csv("batch.csv", make_rows(3))
    before = ws.invoke("send", "batch.csv", "--run-id", "before", env={KEY_ENV: None})
    assert before.exit_code == 0, before.output
    ws.write_csv("later.csv", make_rows(3, start=10))
    after = ws.invoke("send", "later.csv", "--run-id", "after", env={KEY_ENV: KEY})
    assert after.exit_code == 0, after.output
    keyed = ws.invoke("verify", env={KEY_ENV: KEY})
    assert keyed.exit_code == 5, keyed.output
    assert "run after: keyed" in keyed.output, keyed.output
    assert "a run sent before the key was adopted" in keyed.output, keyed.output
    without = ws.invoke("verify", "before", env={KEY_ENV: None})
    assert without.exit_code == 0, without.output
    assert "run before: unkeyed" in without.output, without.output
