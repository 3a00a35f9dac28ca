"""Smaller wrong answers (item 7): exit codes and messages that told an operator
something untrue — an expired run reported as done, Ctrl-C during planning or a manual
reconcile called an internal error, a missing secret found after the run was stored, an
unusable lease TTL, a dangling --db symlink, and a stop reason left after its cause was
settled."""

from __future__ import annotations

import errno
import os
import select
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from notifier.cli import cli

from .conftest import Inbox, Workspace, make_rows


def start(ws: Workspace, *args: str, stdin: int | None = None) -> subprocess.Popen[bytes]:
    """`notifier --db <ws.db> ARGS` as a real process that Ctrl-C (SIGINT) reaches, even when
    the suite itself was started with SIGINT ignored (a background job of a shell)."""
    return subprocess.Popen(
        [sys.executable, "-m", "notifier", "--db", str(ws.db), *args],
        cwd=ws.path,
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=_default_sigint,  # noqa: PLW1509 (one signal() call: no lock, no import)
    )


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def read_until(proc: subprocess.Popen[bytes], marker: bytes, times: int = 1) -> bytes:
    """What the process wrote on stdout until `marker` has appeared `times` times."""
    assert proc.stdout is not None
    seen = b""
    deadline = time.monotonic() + 60
    while seen.count(marker) < times:
        assert time.monotonic() < deadline, seen
        ready, _, _ = select.select([proc.stdout], [], [], 1)
        if ready:
            chunk = os.read(proc.stdout.fileno(), 65536)
            assert chunk, f"the process ended before {marker!r}: {seen!r}"
            seen += chunk
    return seen


@pytest.mark.both_stores
def test_a_run_whose_items_expired_exits_3_not_0(ws: Workspace) -> None:
    """A send whose every item expired (never sent) exits 3 and says so, not 0."""
    batch = ws.write_csv("b.csv", make_rows(2))
    result = ws.invoke("send", str(batch), "--not-after", "2020-01-01T00:00:00Z", "--allow-expired")
    assert result.exit_code == 3, result.output
    assert "2 expired" in result.output
    assert ws.outbox_documents() == []
    assert ws.status()["counts"]["expired"] == 2


@pytest.mark.both_stores
def test_ctrl_c_while_planning_stores_nothing_and_exits_130(ws: Workspace) -> None:
    """Ctrl-C while the batch is still being read and validated stores nothing and exits 130
    with a one-line message, not exit 1 with click's `Aborted!`."""
    fifo = ws.path / "batch.csv"
    os.mkfifo(fifo)  # the process reads what we write: it is planning until we close it
    proc = start(ws, "send", str(fifo))
    deadline = time.monotonic() + 60
    while True:  # opening the write end succeeds once the process opened the file to read it
        try:
            writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError as exc:
            assert exc.errno == errno.ENXIO, exc
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the process never opened the batch"
            time.sleep(0.02)
    try:
        os.write(writer, b"id,to,subject,body\nu1,a@x.example,S,B\n")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        os.close(writer)
    assert proc.returncode == 130, (out, err)
    lines = err.decode().strip().splitlines()
    assert len(lines) == 1 and "nothing was stored" in lines[0], lines
    assert "Aborted" not in lines[0] and "internal error" not in lines[0]
    assert not ws.has_database()


def two_unknown_items(ws: Workspace) -> str:
    """A run on the (unqueryable) SMTP channel whose items u1 and u2 are unknown (each killed
    right after its send), u3 sent; the run paused for them. Returns the run id."""
    ws.write_csv("batch.csv", make_rows(3))
    crash_1 = {"NOTIFIER_CRASH_AT": "after-send:1"}
    assert ws.run("send", "batch.csv", "--channel", "mail", env=crash_1).returncode == 137
    crash_2 = {"NOTIFIER_CRASH_AT": "after-send:2"}
    assert ws.run("resume", env=crash_2).returncode == 137
    assert ws.run("resume").returncode == 3
    assert ws.query("SELECT item_id FROM items WHERE state = 'unknown' ORDER BY seq") == [
        ("u1",),
        ("u2",),
    ]
    ((run_id,),) = ws.query("SELECT run_id FROM runs")
    return str(run_id)


@pytest.mark.both_stores
def test_ctrl_c_in_manual_reconcile_exits_130_saying_what_was_recorded(
    ws: Workspace, inbox: Inbox
) -> None:
    """Ctrl-C at the second prompt of `reconcile --manual` keeps the first decision, exits
    130 and says which decision was recorded and what is left, not exit 3 in silence."""
    run_id = two_unknown_items(ws)
    proc = start(ws, "reconcile", "--manual", stdin=subprocess.PIPE)
    assert proc.stdin is not None
    read_until(proc, b"delivered?")
    proc.stdin.write(b"s\nseen in the mail log\n")
    proc.stdin.flush()
    read_until(proc, b"delivered?")  # u2's prompt: u1's decision is recorded
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    lines = err.decode().strip().splitlines()
    assert len(lines) == 1, lines
    assert "1 decision(s) recorded" in lines[0] and "item u1 → sent" in lines[0], lines
    assert "1 unknown item(s) left" in lines[0] and f"reconcile --manual {run_id}" in lines[0]
    assert ws.query("SELECT seq, decision FROM decisions") == [(1, "mark_sent")]
    states = dict(ws.query("SELECT item_id, state FROM items"))
    assert states == {"u1": "sent", "u2": "unknown", "u3": "sent"}


@pytest.mark.both_stores
@pytest.mark.parametrize(
    ("channel", "environment", "named"),
    [
        (
            'type = "webhook"\nurl = "http://127.0.0.1:9/n"\nsecret_env = "HOOKS_SECRET"\n',
            {},
            "HOOKS_SECRET",
        ),
        (
            'type = "webhook"\nurl = "http://127.0.0.1:9/n"\nsecret_env = "HOOKS_SECRET"\n',
            {"HOOKS_SECRET": "not-a-signing-secret-9f8e7d"},
            "HOOKS_SECRET",
        ),
        (
            'type = "webhook"\nurl = "http://127.0.0.1:9/n"\nsecret_env = "HOOKS_SECRET"\n',
            {"HOOKS_SECRET": "whsec_!!!"},
            "HOOKS_SECRET",
        ),
        ('type = "apprise"\nurls_env = "ALERT_URLS"\n', {}, "ALERT_URLS"),
    ],
    ids=["secret-unset", "secret-invalid", "secret-empty", "urls-unset"],
)
def test_a_missing_or_bad_secret_from_the_environment_stores_nothing(
    ws: Workspace,
    monkeypatch: pytest.MonkeyPatch,
    channel: str,
    environment: dict[str, str],
    named: str,
) -> None:
    """A channel's secret or URL list from the environment that is unset or unusable exits 2
    before the run is stored, naming the variable and never its value."""
    monkeypatch.delenv("HOOKS_SECRET", raising=False)
    monkeypatch.delenv("ALERT_URLS", raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    (ws.path / "notifier.toml").write_text(f"[channels.hooks]\n{channel}")
    batch = ws.write_csv("b.csv", make_rows(2))
    result = ws.invoke("send", str(batch), "--channel", "hooks")
    assert result.exit_code == 2, result.output
    assert named in result.output and "Nothing was stored" in result.output
    assert "Traceback" not in result.output
    for value in environment.values():
        assert value not in result.output
    assert not ws.has_database() or ws.query("SELECT COUNT(*) FROM runs") == [(0,)]


@pytest.mark.both_stores
@pytest.mark.parametrize("ttl", ["0.001", "1.5"])
def test_a_lease_ttl_below_the_minimum_is_refused_when_the_config_loads(
    ws: Workspace, ttl: str
) -> None:
    """`[lease] ttl` below 2 seconds exits 2 at load, naming the setting, why and the fix,
    before anything is stored; 2 itself is accepted."""
    (ws.path / "notifier.toml").write_text(f"[lease]\nttl = {ttl}\n")
    batch = ws.write_csv("b.csv", make_rows(2))
    result = ws.invoke("send", str(batch))
    assert result.exit_code == 2, result.output
    message = result.output.strip()
    assert len(message.splitlines()) == 1, message
    assert "[lease] ttl" in message and "minimum of 2 seconds" in message
    assert "Set `ttl` to 2 or more" in message and "Traceback" not in message
    assert not ws.has_database()
    (ws.path / "notifier.toml").write_text("[lease]\nttl = 2\n")
    assert ws.invoke("send", str(batch)).exit_code == 0


def test_a_dangling_db_symlink_gets_a_clear_message_and_exit_2(ws: Workspace) -> None:
    """`--db` naming a symbolic link to a missing file exits 2 with one paragraph naming the
    link, its target and what to do, for a command that would create the database and for
    one that only reads it; nothing is created."""
    link = ws.path / "receipts-link.db"
    link.symlink_to(ws.path / "gone" / "receipts.db")
    batch = ws.write_csv("b.csv", make_rows(1))
    for args in (["send", str(batch)], ["status"]):
        result = CliRunner().invoke(cli, ["--db", str(link), *args], catch_exceptions=False)
        assert result.exit_code == 2, result.output
        message = result.output.strip()
        assert len(message.splitlines()) == 1, message
        assert f"{link} is a symbolic link to {ws.path / 'gone' / 'receipts.db'}" in message
        assert "does not exist" in message and "point --db" in message
        assert "FileNotFoundError" not in message and "internal error" not in message
    assert not (ws.path / "gone").exists() and link.is_symlink()


def mark(ws: Workspace, item: str, decision: str) -> None:
    result = ws.invoke(
        "reconcile", "--manual", "--item", item, "--mark", decision, "--evidence", "mail log"
    )
    assert result.exit_code in (0, 3), result.output


@pytest.mark.both_stores
def test_settling_unknown_items_by_hand_updates_then_clears_the_stop_reason(
    ws: Workspace, inbox: Inbox
) -> None:
    """A run paused for unknown outcomes: each manual decision brings "stopped because" up to
    date, and once no item is unknown it is gone, though the run still waits to resume."""
    two_unknown_items(ws)
    assert ws.status()["stop_reason"] == "2 item(s) with unknown outcome"
    mark(ws, "u1", "not-sent")
    assert ws.status()["stop_reason"] == "1 item(s) with unknown outcome"
    mark(ws, "u2", "sent")
    report = ws.status()
    assert report["state"] == "paused" and report["stop_reason"] is None
    assert "stopped because" not in ws.invoke("status").output
    assert ws.invoke("resume").exit_code == 0
    assert ws.status()["state"] == "completed"


@pytest.mark.both_stores
def test_a_run_completed_by_manual_reconcile_shows_no_stop_reason(
    ws: Workspace, inbox: Inbox
) -> None:
    """A run that `reconcile --manual` completes no longer says it stopped because of
    unknown outcomes."""
    two_unknown_items(ws)
    mark(ws, "u1", "sent")
    mark(ws, "u2", "abandon")
    report = ws.status()
    assert report["state"] == "completed" and report["stop_reason"] is None
    assert "stopped because" not in ws.invoke("status").output
