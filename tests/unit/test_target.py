"""--db is parsed once into a Target, and what the commands need of it is asked in
their own terms: nothing above store/ asks which engine it names. The lease a sending process
holds is one of two kinds behind one protocol, picked by what the store says of itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from notifier.engine import membership as lease_module
from notifier.store import NotADatabasePath, RunFence, Store, WorkerFence, parse_target
from notifier.store.target import PostgresUrl, SqliteFile

from ..conftest import Workspace, make_rows


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


@pytest.mark.parametrize("given", ["", "  "])
def test_an_empty_db_names_no_database_and_says_so(given: str) -> None:
    """Not "the current directory is a directory": the value is empty, as an unset
    variable expanded in a script leaves it."""
    with pytest.raises(NotADatabasePath, match="--db is empty"):
        parse_target(given)


@pytest.mark.parametrize("scheme", ["postgresql", "postgres"])
def test_a_url_is_a_server_whose_runs_are_shared_and_never_holds_a_password(
    scheme: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    target = parse_target(f"{scheme}://ops@db.example:5433/receipts")
    assert isinstance(target, PostgresUrl)
    assert target.shares_runs and target.may_hold_runs()
    assert target.local_dir == tmp_path  # where the command runs
    assert str(target) == "postgresql://ops@db.example:5433/receipts"
    # A password in the URL is refused (it comes from PGPASSWORD or ~/.pgpass), unshown.
    with pytest.raises(NotADatabasePath) as refused:
        parse_target(f"{scheme}://ops:hunter2@db.example:5433/receipts")
    assert "hunter2" not in str(refused.value) and "PGPASSWORD" in str(refused.value)


@pytest.mark.both_stores
def test_the_lease_of_a_sending_process_is_the_kind_its_store_shares(ws: Workspace) -> None:
    """On a store that shares runs, a sending process joins as a worker (SharedLease: the
    lease's store is fenced by its own worker lease); else it holds the run's one lease and
    works through the store it took it on. The Target says the same as the store it opens."""
    ws.write_csv("batch.csv", make_rows(1))
    assert ws.invoke("send", "batch.csv").exit_code == 0
    store = Store.open(parse_target(ws.db))
    try:
        assert store.shares_runs == parse_target(ws.db).shares_runs == (ws.store == "postgres")
        (run,) = store.core.runs()
        kind = lease_module.for_sending(store)
        assert kind is (lease_module.SharedLease if store.shares_runs else lease_module.SoleLease)
        with kind(store, run.run_id, 30.0) as held:
            assert held.surely_valid()
            assert isinstance(held.store.fencing, WorkerFence) == store.shares_runs
            assert (held.store is store) != store.shares_runs
            assert store.fencing == RunFence()
    finally:
        store.close()
