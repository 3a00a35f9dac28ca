"""Start-up: a read-only command loads none of the libraries that only sending needs."""

from __future__ import annotations

import shutil
import sqlite3

from sqlite_utils import Database, Migrations

from notifier import schema

from .conftest import ROOT, Workspace


def test_the_plain_sql_read_of_applied_migrations_agrees_with_sqlite_utils(ws: Workspace) -> None:
    """Which migrations a file has, as every open reads them without sqlite-utils, is what
    sqlite-utils itself records, before and after it applies the pending ones."""

    def recorded(conn: sqlite3.Connection) -> set[str]:
        return {m.name for m in Migrations(schema.MIGRATION_SET).applied(Database(conn))}

    assert Migrations.migrations_table == schema.MIGRATIONS_TABLE
    shutil.copy(ROOT / "tests" / "fixtures" / "m004-inflight-run.db", ws.db_file)
    conn = sqlite3.connect(ws.db_file)
    try:
        m001_to_m003 = {m.__name__ for m in schema.MIGRATIONS[:3]}
        assert schema.applied(conn) == recorded(conn) == m001_to_m003
        schema.apply(conn)
        assert schema.applied(conn) == recorded(conn) == {m.__name__ for m in schema.MIGRATIONS}
    finally:
        conn.close()
