"""A read-only command (`status`, `report`, `verify`) that meets a lock another PostgreSQL
session holds for longer than the lock timeout (a migration of another version, a
`LOCK TABLE` by an administrator, a long `VACUUM FULL`) names the lock, with exit 3 and
where to find its holder: never "could not be reached", which sends the operator after a
server and a network that are fine. Its statement runs outside any transaction, so it is
named where such a statement's failure is (`PostgresEngine._lost`), not where a write's is."""

from __future__ import annotations

import os
from collections.abc import Iterator

import psycopg
import pytest

from notifier.store import postgres

from ..conftest import Workspace, make_rows
from ..support.postgres import postgres_schema

pytestmark = [pytest.mark.timeout(120)]


@pytest.fixture
def locked(
    ws: Workspace, postgres_server: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Workspace]:
    """A run sent to a schema of its own, then its `runs` table locked by another session."""
    with postgres_schema(postgres_server) as url:
        monkeypatch.setenv("NOTIFIER_DB", url)
        ws.write_csv("b.csv", make_rows(2))
        sent = ws.invoke("send", "b.csv", "--run-id", "r1", env={"NOTIFIER_DB": url})
        assert sent.exit_code == 0, sent.output
        monkeypatch.setattr(postgres, "LOCK_TIMEOUT_S", 1)  # the wait shortened, not the rule
        with psycopg.connect(url) as holder, holder.transaction():
            holder.execute("LOCK TABLE runs IN ACCESS EXCLUSIVE MODE")
            yield ws


@pytest.mark.parametrize("command", [("status", "r1"), ("report", "r1"), ("verify", "r1")])
def test_a_lock_held_by_another_session_is_named_with_exit_3(
    locked: Workspace, command: tuple[str, ...]
) -> None:
    result = locked.invoke(*command, env={"NOTIFIER_DB": os.environ["NOTIFIER_DB"]})
    assert "internal error" not in result.output, result.output
    assert result.exit_code == 3, result.output
    assert "locked by another session" in result.output, result.output
    assert "pg_stat_activity" in result.output, result.output
    assert "could not be reached" not in result.output, result.output
