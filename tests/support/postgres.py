"""PostgreSQL for the `[postgres]` test variants: the server named by NOTIFIER_TEST_POSTGRES,
else a throwaway cluster of this machine's PostgreSQL binaries; a fresh schema per test."""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from notifier.store.postgres import describe

from .net import free_port


def schema_url(server: str, schema: str) -> str:
    """`server`'s URL with `schema` as the search path: where the store creates its tables."""
    return f"{server}{'&' if '?' in server else '?'}options=-csearch_path%3D{schema}"


def schema_of(url: str) -> str:
    """The schema a `schema_url` names."""
    return url.rsplit("csearch_path%3D", 1)[1]


# The server's catalogs that a test's schema, created, migrated and dropped, leaves dead rows
# in. On a server whose autovacuum is off nothing clears them, and each new session (every
# command opens one) reads through them: three whole suite runs' schemas made opening a store
# cost the server 31 ms instead of 9, and every later run was slower than the one before.
CHURNED_CATALOGS = ("pg_class", "pg_attribute", "pg_type", "pg_depend", "pg_index",
                    "pg_constraint", "pg_attrdef", "pg_trigger", "pg_namespace",
                    "pg_statistic", "pg_sequence", "pg_proc")  # fmt: skip


def vacuum_catalogs(server: str) -> None:
    """Clear the dead rows that earlier runs' schemas left in `server`'s catalogs, unless its
    autovacuum does (a user who may not vacuum them gets a warning, not an error). Called once
    per run, before any test: vacuums run beside the tests queue behind one another, and each
    tries for up to 5 s per catalog for the lock that truncates it.
    Within one run the dead rows stay few enough not to matter."""
    with psycopg.connect(server, autocommit=True, connect_timeout=10) as pg:
        settings = pg.execute(
            "SELECT current_setting('autovacuum'), current_setting('track_counts')"
        )
        if settings.fetchone() != ("on", "on"):  # autovacuum needs both
            pg.execute("VACUUM " + ", ".join(f"pg_catalog.{name}" for name in CHURNED_CATALOGS))


# The per-run counters that differ from a count of the items, and the notes of moves a
# transaction left unfolded (m017): none, whatever the test did.
_DRIFT = """
SELECT run_id, state, COALESCE(c.n, 0), COALESCE(i.n, 0) FROM run_counts c
FULL JOIN (SELECT run_id, state, COUNT(*) AS n FROM items GROUP BY run_id, state) i
    USING (run_id, state)
WHERE COALESCE(c.n, 0) <> COALESCE(i.n, 0)
"""


def assert_counters_agree(url: str) -> None:
    """After a test on its own schema (workers, a second workspace): as the teardown of
    every workspace checks its own database, the counters equal the items and no notes of
    moves are left behind."""
    with psycopg.connect(url, autocommit=True) as pg:
        tables = {
            name
            for (name,) in pg.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
            )
        }
        if "run_counts" not in tables:
            return
        drift = pg.execute(_DRIFT).fetchall()
        assert not drift, f"run_counts drifted from the items: {drift}"
        if "run_count_moves" in tables:
            left = pg.execute("SELECT COUNT(*) FROM run_count_moves").fetchone()
            assert left == (0,), f"notes of moves left unfolded: {left}"


@contextlib.contextmanager
def postgres_schema(server: str, *, check: bool = True) -> Iterator[str]:
    """A fresh schema on `server` for one test, dropped with everything in it afterwards;
    `check`: its counters checked first, if the test ended normally (a workspace's schema
    is checked by the workspace's own teardown)."""
    schema = f"t_{secrets.token_hex(6)}"
    with psycopg.connect(server, autocommit=True) as pg:
        pg.execute(f"CREATE SCHEMA {schema}")
    try:
        yield schema_url(server, schema)
        if check:
            assert_counters_agree(schema_url(server, schema))
    finally:
        with psycopg.connect(server, autocommit=True) as pg:
            # A worker the test killed may leave its session for a moment: wait for it.
            pg.execute("SET lock_timeout = '30s'")
            pg.execute(f"DROP SCHEMA {schema} CASCADE")


def server_url() -> Iterator[str]:
    """The URL of a PostgreSQL database the tests may create schemas in: NOTIFIER_TEST_POSTGRES
    (which must then be reachable), else a throwaway cluster, else the test skips. A generator
    for a session fixture: the cluster, if one was started, stops when it is closed."""
    url = os.environ.get("NOTIFIER_TEST_POSTGRES", "")
    if url:
        try:
            psycopg.connect(url, connect_timeout=10).close()
            unreachable = ""
        except psycopg.Error as exc:
            unreachable = _first_line(exc)
        if unreachable:  # failed outside the except block: the message alone, no chain
            pytest.fail(
                f"NOTIFIER_TEST_POSTGRES names {describe(url)}, which is not reachable "
                f"({unreachable}). Start that server, or unset the variable to test "
                "against a throwaway cluster of this machine's PostgreSQL binaries.",
                pytrace=False,
            )
        yield url
        return
    bindir = _postgres_bindir()
    if bindir is None:
        pytest.skip(
            "PostgreSQL variant: NOTIFIER_TEST_POSTGRES is not set and no PostgreSQL binaries "
            "(initdb, pg_ctl) were found on PATH or in /usr/lib/postgresql/*/bin"
        )
    with _throwaway_cluster(bindir) as cluster:
        yield cluster


def _postgres_bindir() -> Path | None:
    """The newest /usr/lib/postgresql/N/bin holding initdb and pg_ctl, else PATH's."""
    versions = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: int(d.split("/")[-2] or 0)
    )
    candidates = [Path(d) for d in reversed(versions)]
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(Path(initdb).parent)
    for bindir in candidates:
        if (bindir / "initdb").exists() and (bindir / "pg_ctl").exists():
            return bindir
    return None


@contextlib.contextmanager
def _throwaway_cluster(bindir: Path) -> Iterator[str]:
    """initdb and start a cluster in a temp dir (trust auth, a free port on 127.0.0.1, its
    socket in that dir), stopped and removed at the end. PostgreSQL refuses to run as root,
    so as root it runs as the `postgres` user."""
    root = Path(tempfile.mkdtemp(prefix="notifier-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:
        runuser = shutil.which("runuser")
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            owner = None
        if runuser is None or owner is None:
            shutil.rmtree(root)
            pytest.skip(
                "PostgreSQL variant: running as root, and a throwaway cluster needs the "
                "`postgres` user and runuser; or set NOTIFIER_TEST_POSTGRES"
            )
        os.chown(root, owner.pw_uid, owner.pw_gid)
        as_user = [runuser, "-u", "postgres", "--"]
    data, log, port = root / "data", root / "server.log", free_port()
    options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off"

    def ctl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*as_user, str(bindir / "pg_ctl"), "-D", str(data), *args],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip

    made = subprocess.run(
        [*as_user, str(bindir / "initdb"), "-D", str(data), "-U", "postgres",
         "--auth=trust", "--encoding=UTF8", "--no-sync"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    started = made.returncode == 0 and ctl("-l", str(log), "-o", options, "-w", "start")
    if not started or started.returncode != 0:
        detail = (made.stderr if made.returncode else started and started.stderr) or ""
        if log.exists():
            detail += log.read_text(errors="replace")[-2000:]
        shutil.rmtree(root, ignore_errors=True)
        pytest.fail(
            f"could not start a throwaway PostgreSQL cluster with {bindir}: {detail.strip()}. "
            "Set NOTIFIER_TEST_POSTGRES to a server's URL instead.",
            pytrace=False,
        )
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        ctl("-m", "immediate", "stop")
        shutil.rmtree(root, ignore_errors=True)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
