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

import pytest
from click.testing import CliRunner

from notifier.cli import cli

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
