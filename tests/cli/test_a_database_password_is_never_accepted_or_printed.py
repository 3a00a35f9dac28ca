"""Secrets come only from the environment: a --db (or NOTIFIER_DB) that holds a PostgreSQL
password is refused with exit 2, without showing the password and without creating
anything, whatever the spelling libpq would read the password from."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner, Result

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
    # Any of libpq's keywords may come first, not only the usual ones.
    pytest.param(f"gssencmode=disable password={SECRET}", id="conninfo-gssencmode-first"),
    pytest.param(
        f"target_session_attrs=any host=127.0.0.1 password={SECRET}", id="conninfo-other-first"
    ),
    # A stray leading space (a YAML or .env file): still a URL, never an SQLite path.
    pytest.param(f" postgresql://postgres:{SECRET}@127.0.0.1:1/postgres", id="leading-space"),
    # The scheme in capitals: not a lower-case prefix, so read as a file name.
    pytest.param(f"POSTGRESQL://postgres:{SECRET}@127.0.0.1:1/postgres", id="upper-case-scheme"),
]


SEND = ["send", "batch.csv", "--require-approval"]


def given_as(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, db: str, how: str, commands: list[list[str]]
) -> list[Result]:
    """Each of `commands` run in a directory holding a batch and a channel, with `db` given
    as --db (`how` "option") or as NOTIFIER_DB ("env")."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("NOTIFIER_DB", raising=False)
    (tmp_path / "batch.csv").write_text("to,subject,body\na@example.com,hi,there\n")
    (tmp_path / "notifier.toml").write_text(
        '[channels.out]\ntype = "webhook"\nurl = "http://127.0.0.1:9/n"\n'
    )
    runner = CliRunner()
    if how == "option":
        return [runner.invoke(cli, ["--db", db, *args]) for args in commands]
    return [runner.invoke(cli, args, env={"NOTIFIER_DB": db}) for args in commands]


@pytest.mark.parametrize("db", HOLDING_A_PASSWORD)
@pytest.mark.parametrize("how", ["option", "env"])
def test_a_password_in_the_db_target_is_refused_without_showing_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, db: str, how: str
) -> None:
    # `status` only reads; `send` would create a database wherever the target led.
    commands = [["status"]] if db.startswith("postgresql://") else [["status"], SEND]
    for result in given_as(tmp_path, monkeypatch, db, how, commands):
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


@pytest.mark.parametrize("parameter", ["oauth_client_secret", "scram_client_key"])
def test_every_parameter_libpq_holds_secret_is_refused(parameter: str) -> None:
    """Beside the password: what libpq marks secret (oauth_client_secret, libpq 18) and the
    SCRAM keys, which log in as the password does. Refused before anything connects, where
    libpq knows the parameter at all."""
    from psycopg import ProgrammingError  # noqa: PLC0415 (only this test)
    from psycopg.conninfo import conninfo_to_dict  # noqa: PLC0415

    from notifier.store import NotADatabasePath, parse_target  # noqa: PLC0415

    db = f"postgresql://postgres@127.0.0.1:1/postgres?{parameter}={SECRET}"
    try:
        conninfo_to_dict(db)
    except ProgrammingError:
        pytest.skip(f"this libpq does not know {parameter}")
    with pytest.raises(NotADatabasePath) as refused:
        parse_target(db)
    assert SECRET not in str(refused.value)
    assert "password" in str(refused.value)


OTHER_URLS = [
    pytest.param(f"mysql://root:{SECRET}@127.0.0.1/test", id="mysql"),
    pytest.param(f"sqlite:///{SECRET}.db", id="sqlalchemy-sqlite"),
    pytest.param(f"https://user:{SECRET}@db.example.com/x", id="https"),
    pytest.param(f"postgresql+psycopg://postgres:{SECRET}@127.0.0.1/postgres", id="sqlalchemy-pg"),
]


@pytest.mark.parametrize("db", OTHER_URLS)
@pytest.mark.parametrize("how", ["option", "env"])
def test_a_url_of_another_kind_is_refused_without_quoting_it_or_making_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, db: str, how: str
) -> None:
    """A URL of a database notifier does not use, or in another library's spelling, is
    neither a PostgreSQL target nor an SQLite file to create under directories named after
    its parts (its advice would have been `mkdir -p` of them, password and all): exit 2,
    naming the two forms --db takes, the URL not shown."""
    for result in given_as(tmp_path, monkeypatch, db, how, [["status"], SEND]):
        assert result.exit_code == 2, result.output
        assert SECRET not in result.output, result.output
        assert "postgresql://" in result.output, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["batch.csv", "notifier.toml"]
