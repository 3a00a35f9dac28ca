"""A statement written once (`%(name)s`) is compiled for each driver to numbered parameters,
`?n` for SQLite and `$n` for PostgreSQL, each name one parameter however often it appears,
and the names returned in that order: the engine binds the values by position (SQLite's
named binding walks the statement's list of names for each one: n squared)."""

from __future__ import annotations

import sqlite3

import pytest

from notifier.store import statements

TEXT = "SELECT %(a)s, %(b)s, {least}(%(a)s, %(c)s) WHERE x LIKE 'x%%'"


@pytest.mark.timeout(10)
def test_sqlite_numbers_each_name_once_in_order_of_first_appearance() -> None:
    text, names = statements.for_sqlite(TEXT, {"least": "MIN"})
    assert text == "SELECT ?1, ?2, MIN(?1, ?3) WHERE x LIKE 'x%'"
    assert names == ("a", "b", "c")


@pytest.mark.timeout(10)
def test_postgresql_numbers_each_name_once_in_order_of_first_appearance() -> None:
    text, names = statements.for_postgres(TEXT, {"least": "LEAST"})
    assert text == "SELECT $1, $2, LEAST($1, $3) WHERE x LIKE 'x%'"
    assert names == ("a", "b", "c")


@pytest.mark.timeout(10)
def test_sqlite_binds_the_numbered_values_as_their_names_say() -> None:
    text, names = statements.for_sqlite("SELECT %(b)s, %(a)s, %(b)s", {})
    values = {"a": 1, "b": "two", "unused": 3}
    row = sqlite3.connect(":memory:").execute(text, [values[n] for n in names]).fetchone()
    assert row == ("two", 1, "two")
