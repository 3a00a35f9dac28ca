"""The PostgreSQL store's own guarantees, through the real CLI: a foreign or
newer schema is refused untouched, a server that cannot be reached is named without its
password, the schema mirrors SQLite's, and secrets never reach the database."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from click.testing import CliRunner

from notifier.cli import cli
from notifier.sandbox.server import Sandbox

from ..conftest import EXAMPLE, Workspace, free_port, make_rows

# A test needing a PostgreSQL schema of its own gets `ws` parametrised to it alone.
on_postgres = pytest.mark.parametrize("ws", ["postgres"], indirect=True)

SECRET = "SECRET-hunter2-" + "x7Qp"


def tables(ws: Workspace) -> dict[str, int]:
    """Each table of the workspace's schema and its row count."""
    return {name: len(ws.ledger.rows(name)) for name in ws.ledger.tables()}


def assert_one_clear_paragraph(text: str) -> None:
    assert text.strip() and "\n\n" not in text.strip(), text
    assert "Traceback" not in text and "internal error" not in text, text


@on_postgres
def test_schema_holding_foreign_tables_is_refused_untouched(ws: Workspace) -> None:
    """A schema with somebody else's tables: send and status exit 4 naming those tables, and
    nothing is created or changed in it."""
    ws.write("CREATE TABLE customers (id INTEGER PRIMARY KEY, email TEXT)")
    ws.write("INSERT INTO customers VALUES (1, 'ada@example.com')")
    ws.write_csv("batch.csv", make_rows(3))
    for args in (["send", "batch.csv"], ["status"]):
        result = ws.invoke(*args)
        assert result.exit_code == 4, (args, result.output)
        assert "not written by notifier" in result.output and "customers" in result.output
        assert_one_clear_paragraph(result.output)
    assert tables(ws) == {"customers": 1}


@on_postgres
def test_unknown_newer_migration_is_refused_untouched(ws: Workspace) -> None:
    """A schema migrated by a newer notifier (an unknown migration name) is refused with
    exit 4 by a write and a read command alike; its migrations and rows stay as they were."""
    assert ws.invoke("send", str(EXAMPLE)).exit_code == 0
    ws.write(
        "INSERT INTO notifier_migrations (migration_set, name, applied_at) "
        "VALUES ('notifier', 'm999_from_the_future', '2030-01-01')"
    )
    before = tables(ws)
    ws.write_csv("more.csv", make_rows(2, start=500))
    for args in (["send", "more.csv"], ["resume"], ["status"]):
        result = ws.invoke(*args)
        assert result.exit_code == 4, (args, result.output)
        assert "newer version of notifier" in result.output and "m999" in result.output
        assert_one_clear_paragraph(result.output)
    assert tables(ws) == before


def test_unreachable_server_exits_2_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A closed port on 127.0.0.1: exit 2, one paragraph naming the server and the fix."""
    monkeypatch.chdir(tmp_path)
    url = f"postgresql://notifier@127.0.0.1:{free_port()}/receipts"
    for args in (["status"], ["send", str(EXAMPLE)]):
        result = CliRunner().invoke(cli, ["--db", url, *args], catch_exceptions=False)
        assert result.exit_code == 2, (args, result.output)
        assert "cannot connect to PostgreSQL" in result.output
        assert f"127.0.0.1:{urlsplit(url).port}/receipts" in result.output
        assert_one_clear_paragraph(result.output)


@pytest.mark.parametrize("where", ["netloc", "query"])
def test_a_password_in_the_url_is_refused_without_showing_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """Secrets come from the environment only: a URL with a password (user:pw@, or a
    password= parameter) is refused with exit 2, naming PGPASSWORD and ~/.pgpass, the
    password itself nowhere in the output, and nothing is opened or created."""
    monkeypatch.chdir(tmp_path)
    port = free_port()
    url = (
        f"postgresql://notifier:{SECRET}@127.0.0.1:{port}/receipts"
        if where == "netloc"
        else f"postgresql://notifier@127.0.0.1:{port}/receipts?password={SECRET}"
    )
    for args in (["status"], ["send", str(EXAMPLE)]):
        result = CliRunner().invoke(cli, ["--db", url, *args], catch_exceptions=False)
        assert result.exit_code == 2, (args, result.output)
        assert "PGPASSWORD" in result.output and ".pgpass" in result.output
        assert SECRET not in result.output
    assert list(tmp_path.iterdir()) == []


@on_postgres
def test_wrong_database_name_exits_2_naming_it(ws: Workspace) -> None:
    """A database that does not exist on a live server: exit 2, naming it."""
    parts = urlsplit(ws.url)
    netloc = f"{parts.username or 'postgres'}@{parts.hostname}:{parts.port or 5432}"
    url = urlunsplit((parts.scheme, netloc, "/no_such_notifier_db", "", ""))
    result = ws.invoke("--db", url, "status")  # the later --db wins over the workspace's
    assert result.exit_code == 2, result.output
    assert "no_such_notifier_db" in result.stderr and "cannot connect" in result.stderr
    assert_one_clear_paragraph(result.stderr)


@on_postgres
def test_status_before_any_send_says_there_is_no_database_yet(ws: Workspace) -> None:
    """A read-only command on an empty schema: exit 2, "no notifier database here yet", and
    it creates nothing."""
    result = ws.invoke("status")
    assert result.exit_code == 2, result.output
    assert "no notifier database here yet" in result.output
    assert_one_clear_paragraph(result.output)
    assert tables(ws) == {}


def sqlite_layout(db: Path) -> tuple[dict[str, list[str]], dict[str, set[str]]]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        names = [
            n
            for (n,) in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' "
                "AND name NOT LIKE 'sqlite_%' AND name != '_sqlite_migrations'"
            )
        ]
        columns = {
            n: sorted(r[1] for r in conn.execute(f'PRAGMA table_info("{n}")')) for n in names
        }
        indexes: dict[str, set[str]] = {n: set() for n in names}
        for name, table in conn.execute(
            "SELECT name, tbl_name FROM sqlite_master WHERE type = 'index' "
            "AND name NOT LIKE 'sqlite_autoindex_%' AND tbl_name != '_sqlite_migrations'"
        ):
            indexes[table].add(name)
        return columns, indexes
    finally:
        conn.close()


def postgres_layout(ws: Workspace) -> tuple[dict[str, list[str]], dict[str, set[str]]]:
    columns: dict[str, list[str]] = {}
    for table, column in ws.query(
        "SELECT table_name, column_name FROM information_schema.columns "
        "WHERE table_schema = current_schema() AND table_name != 'notifier_migrations'"
    ):
        columns.setdefault(table, []).append(column)
    # Indexes that back a PRIMARY KEY or UNIQUE constraint are SQLite's autoindexes' twins.
    indexes: dict[str, set[str]] = {table: set() for table in columns}
    for table, index in ws.query(
        "SELECT t.relname, i.relname FROM pg_index x "
        "JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid "
        "WHERE t.relnamespace = CAST(current_schema() AS regnamespace) "
        "AND t.relname != 'notifier_migrations' "
        "AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = x.indexrelid)"
    ):
        indexes[table].add(index)
    return {t: sorted(c) for t, c in columns.items()}, indexes


@on_postgres
def test_postgres_schema_mirrors_the_sqlite_schema(ws: Workspace, tmp_path: Path) -> None:
    """After a send on each store, every table has the same column names and the same index
    names on both (besides PostgreSQL's `rowid` identity column of runs, standing in for
    SQLite's implicit rowid, the indexes backing constraints, and `run_count_moves`, where
    PostgreSQL's counters note a transaction's moves until its COMMIT: SQLite writes its
    counters in place)."""
    assert ws.invoke("send", str(EXAMPLE)).exit_code == 0
    sqlite_db = tmp_path / "mirror.db"
    sent = CliRunner().invoke(cli, ["--db", str(sqlite_db), "send", str(EXAMPLE)])
    assert sent.exit_code == 0, sent.output
    sqlite_columns, sqlite_indexes = sqlite_layout(sqlite_db)
    pg_columns, pg_indexes = postgres_layout(ws)
    pg_columns["runs"].remove("rowid")
    assert pg_columns.pop("run_count_moves") == ["fold", "n", "run_id", "state", "xact"]
    assert set(pg_columns) == set(sqlite_columns)
    for table, names in sqlite_columns.items():
        assert pg_columns[table] == names, table
        assert pg_indexes[table] == sqlite_indexes[table], table
    assert sum(len(i) for i in sqlite_indexes.values()) > 0  # the comparison compared something


@on_postgres
def test_secrets_never_reach_the_database(ws: Workspace) -> None:
    """A signed webhook run, its secret and the database password (PGPASSWORD) from the
    environment: neither appears in any cell of any table, nor in what the commands print."""
    parts = urlsplit(ws.url)
    if parts.password:
        pytest.skip("NOTIFIER_TEST_POSTGRES carries a password already; cannot add another")
    try:
        psycopg.connect(ws.url, password=SECRET, connect_timeout=10).close()
    except psycopg.OperationalError as exc:
        pytest.skip(f"the test server checks passwords (not trust auth): {exc}")
    with Sandbox() as sandbox:
        (ws.path / "notifier.toml").write_text(
            f'[channels.hooks]\ntype = "webhook"\nurl = "{sandbox.notifications_url}"\n'
            'secret_env = "HOOKS_SECRET"\n'
        )
        ws.write_csv("batch.csv", make_rows(3))
        env = {"HOOKS_SECRET": "whsec_" + "TWZLUTlyOEdLWXFyVHdqVVBEOElMUFpJ", "PGPASSWORD": SECRET}
        printed = ""
        for args in (["send", "batch.csv", "--channel", "hooks"], ["status"], ["report"]):
            result = ws.invoke(*args, env=env)  # the environment set for the command alone
            assert result.exit_code == 0, result.output
            printed += result.output
        assert sandbox.stats()["totals"]["commits"] == 3
    assert SECRET not in printed and env["HOOKS_SECRET"] not in printed
    cells = 0
    for table in tables(ws):
        for row in ws.ledger.rows(table):
            for cell in row:
                cells += 1
                assert SECRET not in str(cell), table
                assert env["HOOKS_SECRET"] not in str(cell), table
                assert "TWZLUTlyOEdLWXFy" not in str(cell), table
    assert cells > 0


def _scanned_by_claim(url: str, run_id: str) -> list[dict[str, object]]:
    """The scan nodes of the plan PostgreSQL picks for the claim's move of three items."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "EXPLAIN (FORMAT JSON) UPDATE items SET state = 'in_flight' "
            "WHERE run_id = %s AND seq IN (1, 2, 3) AND state = 'pending'",
            (run_id,),
        ).fetchone()
    assert row is not None
    nodes, found = [row[0][0]["Plan"]], []
    while nodes:
        node = nodes.pop()
        nodes.extend(node.get("Plans", []))
        if "Scan" in node["Node Type"]:
            found.append(node)
    return found


@on_postgres
def test_a_freshly_planned_run_is_claimed_by_key_not_by_scanning_it(ws: Workspace) -> None:
    """Right after planning (before autovacuum has looked at the table), the claim's move
    finds its items by (run_id, seq): PostgreSQL has statistics for the rows just copied,
    instead of guessing one row and reading every pending item of the run per claim."""
    ws.write_csv("batch.csv", make_rows(3000))
    planned = ws.invoke("send", "batch.csv", "--run-id", "fresh", "--require-approval")
    assert planned.exit_code == 0, planned.output
    scans = _scanned_by_claim(str(ws.db), "fresh")
    assert scans, "no scan node in the plan"
    for node in scans:
        assert "seq" in str(node.get("Index Cond", "")), node
