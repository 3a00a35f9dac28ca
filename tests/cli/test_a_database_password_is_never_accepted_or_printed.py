"""Secrets come only from the environment: a --db (or NOTIFIER_DB) that holds a PostgreSQL
password is refused with exit 2, without showing the password and without creating
anything, whatever the spelling libpq would read the password from."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from notifier.cli import cli

pytestmark = pytest.mark.timeout(60)
SECRET = "SeKrEt123"

HOLDING_A_PASSWORD = [
    # libpq reads the userinfo up to the '@' before the first '/': a '#' or '?' in the
    # password ends urllib's netloc early, so urllib sees no password at all.
    # (A reachable server, as the one of the review (trust auth): connected, not refused.)
    pytest.param(f"postgresql://postgres:{SECRET}#x@127.0.0.1/postgres", id="hash-in-password"),
    pytest.param(f"postgresql://postgres:{SECRET}?x@127.0.0.1/postgres", id="query-in-password"),
    # The passphrase of the client's TLS key, a password by another name.
    pytest.param(
        f"postgresql://postgres@127.0.0.1/postgres?sslpassword={SECRET}", id="sslpassword"
    ),
    # A libpq keyword/value connection string (what many operators paste from a PaaS).
    pytest.param(
        f"host=127.0.0.1 port=1 user=postgres password={SECRET} dbname=postgres",
        id="conninfo-string",
    ),
    # The scheme in capitals: not a lower-case prefix, so read as a file name.
    pytest.param(f"POSTGRESQL://postgres:{SECRET}@127.0.0.1:1/postgres", id="upper-case-scheme"),
]


@pytest.mark.parametrize("db", HOLDING_A_PASSWORD)
@pytest.mark.parametrize("how", ["option", "env"])
def test_a_password_in_the_db_target_is_refused_without_showing_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, db: str, how: str
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("NOTIFIER_DB", raising=False)
    (tmp_path / "batch.csv").write_text("to,subject,body\na@example.com,hi,there\n")
    (tmp_path / "notifier.toml").write_text(
        '[channels.out]\ntype = "webhook"\nurl = "http://127.0.0.1:9/n"\n'
    )
    runner = CliRunner()
    # `status` only reads; `send` would create a database wherever the target led.
    commands = (
        [["status"]]
        if db.startswith("postgresql://")
        else [["status"], ["send", "batch.csv", "--require-approval"]]
    )
    for args in commands:
        if how == "option":
            result = runner.invoke(cli, ["--db", db, *args])
        else:
            result = runner.invoke(cli, args, env={"NOTIFIER_DB": db})
        assert result.exit_code == 2, result.output
        assert SECRET not in result.output, result.output
        assert "password" in result.output, result.output  # refused for it, not for another cause
    # Nothing created: no SQLite file whose very name is the password.
    assert [p.name for p in tmp_path.iterdir() if SECRET in p.name] == []


@pytest.mark.parametrize("how", ["option", "env"])
def test_a_url_that_cannot_be_read_is_refused_without_quoting_its_password(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """urllib's refusal of a netloc with a character NFKC turns into '/' (here a fullwidth
    solidus in the password) quotes the whole netloc, userinfo and all."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("NOTIFIER_DB", raising=False)
    db = f"postgresql://postgres:{SECRET}\uff0fx@127.0.0.1/postgres"
    runner = CliRunner()
    if how == "option":
        result = runner.invoke(cli, ["--db", db, "status"])
    else:
        result = runner.invoke(cli, ["status"], env={"NOTIFIER_DB": db})
    assert result.exit_code == 2, result.output
    assert SECRET not in result.output, result.output
