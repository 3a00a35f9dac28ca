"""--db is parsed once into a Target (issue 22), and what the commands need of it is asked in
their own terms: nothing above store/ asks which engine it names."""

from __future__ import annotations

from pathlib import Path

import pytest

from notifier.store import NotADatabasePath, parse_target
from notifier.store.target import PostgresUrl, SqliteFile

from .conftest import ROOT


def test_a_path_is_an_sqlite_file_beside_which_relative_paths_resolve(tmp_path: Path) -> None:
    target = parse_target(tmp_path / "receipts.db")
    assert isinstance(target, SqliteFile)
    assert target.local_dir == tmp_path
    assert not target.shares_runs
    assert not target.may_hold_runs()  # nothing there yet
    assert str(target) == str(tmp_path / "receipts.db")


def test_a_directory_names_no_database(tmp_path: Path) -> None:
    with pytest.raises(NotADatabasePath, match="is a directory; name a file in it"):
        parse_target(str(tmp_path))


@pytest.mark.parametrize("scheme", ["postgresql", "postgres"])
def test_a_url_is_a_server_whose_runs_are_shared_and_never_shown_with_its_password(
    scheme: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    target = parse_target(f"{scheme}://ops:hunter2@db.example:5433/receipts")
    assert isinstance(target, PostgresUrl)
    assert target.shares_runs and target.may_hold_runs()
    assert target.local_dir == tmp_path  # where the command runs
    assert "hunter2" not in str(target) and "hunter2" not in repr(target)
    assert str(target) == "postgresql://ops@db.example:5433/receipts"


def test_nothing_above_the_store_asks_which_engine_it_has() -> None:
    """The engine is store/'s business: no module outside notifier/store/ tests for it."""
    outside = [
        path
        for path in (ROOT / "notifier").rglob("*.py")
        if "store" not in path.relative_to(ROOT / "notifier").parts
        and "is_postgres" in path.read_text("utf-8")
    ]
    assert outside == []
