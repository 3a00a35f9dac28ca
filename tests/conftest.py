"""Shared fixtures: every test works in its own directory with its own receipts.db, and
drives the real CLI (in-process with CliRunner, or as a subprocess where it must die).

A test module or test marked `both_stores` runs once per store, `[sqlite]` and `[postgres]`:
its `ws` then holds either a receipts.db file or a PostgreSQL schema of its own, on the server
named by NOTIFIER_TEST_POSTGRES, else on a throwaway cluster of this machine's PostgreSQL
binaries, else the `[postgres]` variants skip saying why."""

from __future__ import annotations

import asyncio
import contextlib
import csv
import glob
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from email import message_from_bytes
from email.message import Message
from pathlib import Path
from typing import Any

import psycopg
import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, Envelope, Session
from click.testing import CliRunner, Result

from notifier.cli import cli
from notifier.store.postgres import describe, native

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "batch.csv"
STORES = ("sqlite", "postgres")
# What reading a database that is not there yet (or is being created) raises, on either store.
DB_ERRORS = (sqlite3.Error, psycopg.Error)


def default_sigint() -> None:
    """`preexec_fn` for every process a test starts: SIGINT back to its default, so that a
    test's Ctrl-C reaches the child even when the suite itself runs with SIGINT ignored (a
    background job of a non-interactive shell), whose children would inherit SIG_IGN and,
    being Python, would then install no KeyboardInterrupt handler either."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    """Until `condition()` holds, polled every 20 ms; fails naming `what` after `timeout`
    seconds (a bound for a hung process, never a guess at how long something takes)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout} s: {what}")
        time.sleep(0.02)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "both_stores: run the test once per store ([sqlite], [postgres]) through a "
        "parametrised `ws`",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """`both_stores` tests get `ws` parametrised indirectly, so every fixture built on `ws`
    (inbox, sandboxes, relays) follows the store of the test."""
    if "ws" in metafunc.fixturenames and metafunc.definition.get_closest_marker("both_stores"):
        metafunc.parametrize("ws", STORES, indirect=True)


@dataclass
class Workspace:
    """A directory holding one database (a receipts.db file, or a PostgreSQL schema of its
    own when `url` is set), its outbox and any batch files a test writes."""

    path: Path
    url: str = ""  # the schema's store URL, for a [postgres] test

    @property
    def store(self) -> str:
        return "postgres" if self.url else "sqlite"

    @property
    def db(self) -> Path | str:
        """What `--db` gets: the SQLite file's path, or the PostgreSQL URL."""
        return self.url or self.db_file

    @property
    def db_file(self) -> Path:
        """The SQLite file, for a test about the file itself (its bytes, -wal, permissions)."""
        assert not self.url, "an SQLite-only test was given a PostgreSQL workspace"
        return self.path / "receipts.db"

    @property
    def outbox(self) -> Path:
        return self.path / "outbox"

    def invoke(
        self, *args: str, input: str | None = None, env: Mapping[str, str | None] | None = None
    ) -> Result:
        """Run the CLI in-process, as `notifier --db <ws.db> ARGS` (an `env` value of None
        unsets that variable for the command)."""
        return CliRunner().invoke(
            cli, ["--db", str(self.db), *args], input=input, env=env, catch_exceptions=False
        )

    def run(
        self, *args: str, env: dict[str, str] | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run the CLI as a real process (needed where it must die or be signalled)."""
        return subprocess.run(
            [sys.executable, "-m", "notifier", "--db", str(self.db), *args],
            cwd=self.path,
            env={**os.environ, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,  # the exit status is what most tests assert on
            preexec_fn=default_sigint,
        )

    def popen(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        """Start the CLI as a real process, its SIGINT deliverable (see default_sigint)."""
        return subprocess.Popen(
            [sys.executable, "-m", "notifier", "--db", str(self.db), *args],
            cwd=self.path,
            env={**os.environ, **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=default_sigint,  # noqa: PLW1509 (one signal() call: no lock, no import)
        )

    def write_csv(self, name: str, rows: Sequence[Sequence[str]]) -> Path:
        path = self.path / name
        with path.open("w", newline="", encoding="utf-8") as handle:
            csv.writer(handle).writerows(rows)
        return path

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Read the real database with plain sqlite3 or psycopg, as an operator would
        (read-only: a test must never create the database a worker is about to create).
        `?` parameters on both."""
        if self.url:
            with psycopg.connect(self.url, autocommit=True) as pg:
                pg.execute("SET default_transaction_read_only = on")
                cursor = psycopg.RawCursor(pg).execute(native(sql)[0], params)
                return [tuple(r) for r in cursor]
        conn = sqlite3.connect(f"file:{self.db_file}?mode=ro", uri=True)
        try:
            return [tuple(r) for r in conn.execute(sql, params)]
        finally:
            conn.close()

    def write(self, sql: str, params: Sequence[Any] = ()) -> None:
        """Change the database behind notifier's back, as a test that forges a state does."""
        if self.url:
            with psycopg.connect(self.url, autocommit=True) as pg:
                psycopg.RawCursor(pg).execute(native(sql)[0], params)
            return
        conn = sqlite3.connect(self.db_file)
        try:
            conn.execute(sql, params)
            conn.commit()
        finally:
            conn.close()

    def has_database(self) -> bool:
        """Whether anything was created yet: the file, or any table in the schema."""
        if not self.url:
            return self.db_file.exists()
        return bool(self._pg_tables())

    def _pg_tables(self) -> set[str]:
        return {
            name
            for (name,) in self.query(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = current_schema()"
            )
        }

    def reset(self) -> None:
        """Start again from no database, in the same workspace."""
        if self.url:
            schema = _schema_of(self.url)
            with psycopg.connect(self.url, autocommit=True) as pg:
                pg.execute(f"DROP SCHEMA {schema} CASCADE")
                pg.execute(f"CREATE SCHEMA {schema}")
            return
        for suffix in ("", "-wal", "-shm"):
            self.path.joinpath(f"receipts.db{suffix}").unlink(missing_ok=True)

    def outbox_documents(self) -> list[dict[str, Any]]:
        if not self.outbox.exists():
            return []
        return [json.loads(p.read_text("utf-8")) for p in sorted(self.outbox.glob("*.json"))]

    def status(self) -> dict[str, Any]:
        result = self.invoke("status", "--json")
        assert result.exit_code == 0, result.output
        data: dict[str, Any] = json.loads(result.output)
        return data


@pytest.fixture
def ws(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Workspace]:
    """A workspace on SQLite, or on the store `both_stores` parametrised it with."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("NOTIFIER_CRASH_AT", raising=False)
    monkeypatch.delenv("NOTIFIER_DB", raising=False)
    store = getattr(request, "param", "sqlite")
    if store == "sqlite":
        workspace = Workspace(tmp_path)
        yield workspace
        assert_counters_match_items(workspace)
        return
    server: str = request.getfixturevalue("postgres_server")
    with postgres_schema(server) as url:
        workspace = Workspace(tmp_path, url=url)
        yield workspace
        assert_counters_match_items(workspace)


def assert_counters_match_items(ws: Workspace) -> None:
    """After every test: m004's per-run counters equal a count of the item rows, whatever
    moves the test made (so the whole suite checks that no move path skips them)."""
    if ws.url:
        if "run_counts" not in ws._pg_tables():
            return
    else:
        if not ws.db_file.exists():
            return
        try:
            if not ws.query(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'run_counts'"
            ):
                return
        except sqlite3.DatabaseError:
            return  # a test that damaged or replaced the file on purpose
    kept = set(ws.query("SELECT run_id, state, n FROM run_counts WHERE n != 0"))
    counted = set(ws.query("SELECT run_id, state, COUNT(*) FROM items GROUP BY run_id, state"))
    assert kept == counted, f"run_counts drifted from the items: {kept ^ counted}"


# ---------------------------------------------------------------- PostgreSQL for tests


def schema_url(server: str, schema: str) -> str:
    """`server`'s URL with `schema` as the search path: where the store creates its tables."""
    return f"{server}{'&' if '?' in server else '?'}options=-csearch_path%3D{schema}"


def _schema_of(url: str) -> str:
    return url.rsplit("csearch_path%3D", 1)[1]


@contextlib.contextmanager
def postgres_schema(server: str) -> Iterator[str]:
    """A fresh schema on `server` for one test, dropped with everything in it afterwards."""
    schema = f"t_{secrets.token_hex(6)}"
    with psycopg.connect(server, autocommit=True) as pg:
        pg.execute(f"CREATE SCHEMA {schema}")
    try:
        yield schema_url(server, schema)
    finally:
        with psycopg.connect(server, autocommit=True) as pg:
            # A worker the test killed may leave its session for a moment: wait for it.
            pg.execute("SET lock_timeout = '30s'")
            pg.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """The URL of a PostgreSQL database the tests may create schemas in: NOTIFIER_TEST_POSTGRES
    (which must then be reachable), else a throwaway cluster, else the test skips."""
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


def make_rows(n: int, *, start: int = 1) -> list[list[str]]:
    """A header and `n` plain rows addressed to example.com."""
    rows = [["id", "to", "subject", "body", "name"]]
    for i in range(start, start + n):
        rows.append([f"u{i}", f"user{i}@example.com", f"Hello {i}", f"Body of {i}", f"User {i}"])
    return rows


class Inbox:
    """An aiosmtpd handler keeping every message it accepted."""

    def __init__(self) -> None:
        self.messages: list[Message] = []

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        content = envelope.content
        assert isinstance(content, bytes)
        self.messages.append(message_from_bytes(content))
        return "250 OK"

    def message_ids(self) -> list[str]:
        return [str(m["Message-ID"]) for m in self.messages]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def smtp_server(ws: Workspace, handler: Any, options: str = "") -> Iterator[None]:
    """`handler` as a real SMTP server on 127.0.0.1, and a `mail` channel pointing at it."""
    port = free_port()
    controller = Controller(handler, hostname="127.0.0.1", port=port)
    controller.start()
    (ws.path / "notifier.toml").write_text(
        f'[channels.mail]\ntype = "smtp"\nhost = "127.0.0.1"\nport = {port}\n'
        f'sender = "ops@example.com"\n{options}'
    )
    try:
        yield
    finally:
        controller.stop()


@pytest.fixture
def inbox(ws: Workspace) -> Iterator[Inbox]:
    """A real SMTP server on 127.0.0.1 and a `mail` channel pointing at it."""
    handler = Inbox()
    with smtp_server(ws, handler):
        yield handler


class SlowRelay:
    """An SMTP relay that takes 1 s per message, noting when each MAIL command arrived."""

    def __init__(self) -> None:
        self.mail_times: list[float] = []
        self.first_mail = threading.Event()
        self.seconds = 1.0

    async def handle_MAIL(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: list[str]
    ) -> str:
        self.mail_times.append(time.time())
        self.first_mail.set()
        envelope.mail_from = address
        envelope.mail_options.extend(options)
        return "250 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        await asyncio.sleep(self.seconds)
        return "250 OK"


@pytest.fixture
def slow_relay(ws: Workspace) -> Iterator[SlowRelay]:
    """A real SMTP relay on 127.0.0.1 taking 1 s per message, and a `mail` channel to it."""
    handler = SlowRelay()
    with smtp_server(ws, handler, "timeout = 30\n"):
        yield handler
