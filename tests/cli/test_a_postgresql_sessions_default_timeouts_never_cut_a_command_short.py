"""A PostgreSQL session may start with a `statement_timeout` or an
`idle_in_transaction_session_timeout` that a default gave it (`ALTER DATABASE … SET`,
`ALTER ROLE … SET`, PGOPTIONS, the URL's options), written for interactive sessions. A
command's statements are its own to bound (a lock waits 10 s at most, a write idles 5 s at
most): such a default must never cancel a plan half stored, with a message blaming a lock
that is not there and advising a retry that meets the same timeout, nor end `verify`'s or
`report`'s snapshot with an internal error. Here both are 1 ms, as every session of the
database gets them."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from urllib.parse import unquote

import psycopg
import pytest
from click.testing import CliRunner

from notifier.cli import cli
from notifier.store.postgres import PostgresEngine

from ..conftest import Workspace, make_rows
from ..support.postgres import postgres_schema

SHORT_DEFAULTS = "%20-cstatement_timeout%3D1ms%20-cidle_in_transaction_session_timeout%3D1ms"


@pytest.fixture
def timed_url(postgres_server: str) -> Iterator[str]:
    """A schema of its own whose sessions start with 1 ms timeouts (skips without a server)."""
    with postgres_schema(postgres_server) as url:
        yield url + SHORT_DEFAULTS


def _invoke(db: str, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["--db", db, *args], catch_exceptions=False, input="")
    return result.exit_code, result.output


@pytest.mark.timeout(120)
def test_a_sessions_default_timeouts_never_cut_a_command_short(
    ws: Workspace, timed_url: str
) -> None:
    ws.write_csv("batch.csv", make_rows(500))
    code, out = _invoke(timed_url, "send", "batch.csv", "--concurrency", "8")
    assert code == 0, out
    assert "completed: 500 sent" in out, out

    code, out = _invoke(timed_url, "report", "--format", "csv")
    assert code == 0, out
    assert len(list(csv.DictReader(io.StringIO(out)))) == 500

    code, out = _invoke(timed_url, "verify")
    assert code == 0, out
    code, out = _invoke(timed_url, "send", "batch.csv")
    assert code == 0 and "nothing to send" in out, out


@pytest.mark.timeout(60)
def test_a_session_starts_with_the_defaults_already_cleared(
    timed_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No statement of notifier's may run under the default, not even the first: a
    `SET` that clears it would itself be cancelled when it outlasts a 1 ms timeout (a
    loaded machine). What the session holds as the connection opens, before any statement
    of notifier's, is what its first statement runs under."""
    seen: list[tuple[str, str, str]] = []
    connect = psycopg.connect

    def watched(*args: object, **kwargs: object) -> psycopg.Connection[object]:
        raw = connect(*args, **kwargs)  # type: ignore[arg-type]
        row = raw.execute(
            "SELECT current_setting('statement_timeout') AS statement, "
            "current_setting('idle_in_transaction_session_timeout') AS idle, "
            "current_setting('search_path') AS search_path"
        ).fetchone()
        assert row is not None
        seen.append((str(row[0]), str(row[1]), str(row[2])))
        return raw

    monkeypatch.setattr(psycopg, "connect", watched)
    engine = PostgresEngine.open(timed_url, create=True)
    engine.close()
    assert seen, "the engine opened no connection through psycopg.connect"
    for statement, idle, search_path in seen:
        assert (statement, idle) == ("0", "0")
        assert search_path.startswith("t_"), "the URL's own options are kept"


@pytest.mark.timeout(60)
def test_pgoptions_are_kept_when_the_url_names_none(
    timed_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Startup options given in the environment (PGOPTIONS) still apply: notifier adds its
    own after them rather than putting them aside."""
    base, _, query = timed_url.partition("?options=")
    # Only for this open: the schema fixture's own teardown reads PGOPTIONS too.
    with monkeypatch.context() as env:
        env.setenv("PGOPTIONS", unquote(query))
        engine = PostgresEngine.open(base, create=True)
    try:
        row = engine.execute(
            "SELECT current_setting('search_path') AS search_path, "
            "current_setting('statement_timeout') AS statement"
        ).fetchone()
    finally:
        engine.close()
    assert row is not None
    assert str(row.search_path).startswith("t_") and row.statement == "0"
