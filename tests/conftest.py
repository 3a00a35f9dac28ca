"""Shared fixtures: every test works in its own directory with its own receipts.db, and
drives the real CLI (in-process with CliRunner, or as a subprocess where it must die).

A test module or test marked `both_stores` runs once per store, `[sqlite]` and `[postgres]`:
its `ws` then holds either a receipts.db file or a PostgreSQL schema of its own, on the server
named by NOTIFIER_TEST_POSTGRES, else on a throwaway cluster of this machine's PostgreSQL
binaries, else the `[postgres]` variants skip saying why.

The helpers live in tests/support/, one module per concern; this file only makes fixtures of
them, and re-exports the names tests import `from .conftest`."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from .fake_messages import KEY, FakeMessages
from .support.net import free_port
from .support.postgres import postgres_schema, schema_url, server_url, vacuum_catalogs
from .support.smtp import Inbox, SlowRelay, smtp_server
from .support.waits import no_scaled_waits, scale_waits
from .support.workspace import (
    DB_ERRORS,
    EXAMPLE,
    ROOT,
    STORES,
    Workspace,
    assert_counters_match_items,
    default_sigint,
    make_rows,
    wait_for,
)

__all__ = [
    "DB_ERRORS",
    "EXAMPLE",
    "ROOT",
    "STORES",
    "Inbox",
    "SlowRelay",
    "Workspace",
    "assert_counters_match_items",
    "default_sigint",
    "free_port",
    "make_rows",
    "postgres_schema",
    "schema_url",
    "smtp_server",
    "wait_for",
]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "both_stores: run the test once per store ([sqlite], [postgres]) through a "
        "parametrised `ws`",
    )


def pytest_sessionstart(session: pytest.Session) -> None:
    """Once per run, in the process that hands out the tests and before any runs: vacuum the
    catalogs of NOTIFIER_TEST_POSTGRES's server (a throwaway cluster is new and needs none). An
    unreachable server is left for the `postgres_server` fixture to report."""
    url = os.environ.get("NOTIFIER_TEST_POSTGRES", "")
    if url and not hasattr(session.config, "workerinput"):
        with contextlib.suppress(psycopg.Error):
            vacuum_catalogs(url)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The `slow` tests first, each group in its own order: under pytest-xdist a long test
    handed out last runs alone at the end while the other workers idle. (A stable sort on a
    marker: every worker collects the same order, which xdist requires.)"""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """`both_stores` tests get `ws` parametrised indirectly, so every fixture built on `ws`
    (inbox, sandboxes, relays) follows the store of the test."""
    if "ws" in metafunc.fixturenames and metafunc.definition.get_closest_marker("both_stores"):
        metafunc.parametrize("ws", STORES, indirect=True)


@pytest.fixture(autouse=True)
def _real_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test starts with notifier's waits as in production (see `fast_waits`)."""
    no_scaled_waits(monkeypatch)


@pytest.fixture
def fast_waits(monkeypatch: pytest.MonkeyPatch) -> float:
    """The test switch on (notifier/domain/waits.py): this test's CLI, in-process and in every child
    process, waits a fraction of each Retry-After and backoff. The fraction, for the test to
    pin each wait against what is really waited."""
    return scale_waits(monkeypatch)


@pytest.fixture
def ws(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Workspace]:
    """A workspace on SQLite, or on the store `both_stores` parametrised it with."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("NOTIFIER_CRASH_AT", raising=False)
    monkeypatch.delenv("NOTIFIER_DB", raising=False)
    store = getattr(request, "param", "sqlite")
    with contextlib.ExitStack() as stack:
        url = ""
        if store == "postgres":
            server = request.getfixturevalue("postgres_server")
            # Its counters: the workspace's own teardown (assert_counters_match_items).
            url = stack.enter_context(postgres_schema(server, check=False))
        workspace = Workspace(tmp_path, url=url)
        stack.callback(workspace.close)  # before its schema is dropped
        yield workspace
        workspace.stop_children()  # none still writing while the counters are read
        assert_counters_match_items(workspace)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """The URL of a PostgreSQL database the tests may create schemas in: NOTIFIER_TEST_POSTGRES
    (which must then be reachable), else a throwaway cluster, else the test skips."""
    yield from server_url()


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeMessages]:
    """The fake Messages API on 127.0.0.1 (tests/fake_messages.py), with the SDK pointed at
    it and a key in the environment. A module that needs the batch endpoints overrides it."""
    server = FakeMessages()
    with server.running():
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
        yield server


@pytest.fixture
def inbox(ws: Workspace) -> Iterator[Inbox]:
    """A real SMTP server on 127.0.0.1 and a `mail` channel pointing at it."""
    handler = Inbox()
    with smtp_server(ws, handler):
        yield handler


@pytest.fixture
def slow_relay(ws: Workspace) -> Iterator[SlowRelay]:
    """A real SMTP relay on 127.0.0.1 taking 1 s per message, and a `mail` channel to it."""
    handler = SlowRelay()
    with smtp_server(ws, handler, "timeout = 30\n"):
        yield handler
