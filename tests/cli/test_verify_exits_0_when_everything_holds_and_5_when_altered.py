"""`notifier verify` as a process: exit 0 when every run holds, 5 when anything was altered
(naming the row on stdout, and in --json), 2 for a usage error (a run that is not there),
never a traceback. The key comes from NOTIFIER_AUDIT_KEY or notifier.toml's
`[audit] key_file`, and is never printed."""

from __future__ import annotations

import json

import pytest

from notifier.domain.chain import KEY_ENV, key_id

from ..conftest import Workspace, make_rows
from ..support.audited import KEY

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(120)]


@pytest.fixture
def sent(ws: Workspace) -> Workspace:
    ws.write_csv("batch.csv", make_rows(4))
    done = ws.invoke("send", "batch.csv", "--run-id", "r1", env={KEY_ENV: KEY})
    assert done.exit_code == 0, done.output
    return ws


def test_a_run_that_holds_exits_0_and_says_keyed(sent: Workspace) -> None:
    result = sent.run("verify", "r1", env={KEY_ENV: KEY})
    assert result.returncode == 0, result.stderr
    assert f"run r1: keyed, key {key_id(KEY.encode())}" in result.stdout
    assert KEY not in result.stdout + result.stderr


def test_an_altered_run_exits_5_naming_the_row(sent: Workspace) -> None:
    sent.write("UPDATE attempts SET outcome = 'failed' WHERE run_id = 'r1' AND seq = 2")
    result = sent.run("verify", env={KEY_ENV: KEY})
    assert result.returncode == 5, result.stdout + result.stderr
    assert "attempts: attempt 1 of item u2 (seq 2): outcome is 'failed', expected 'sent'" in (
        result.stdout
    )
    as_json = sent.run("verify", "r1", "--json", env={KEY_ENV: KEY})
    assert as_json.returncode == 5
    (run,) = json.loads(as_json.stdout)["runs"]
    assert run["verdict"] == "altered"
    assert [(f["table"], f["row"], f["column"]) for f in run["findings"]] == [
        ("attempts", "attempt 1 of item u2 (seq 2)", "outcome")
    ]


def test_without_the_key_a_keyed_run_is_unkeyed_and_exits_0(sent: Workspace) -> None:
    result = sent.run("verify", "r1", env={KEY_ENV: ""})
    assert result.returncode == 0, result.stderr
    assert "run r1: unkeyed" in result.stdout
    assert "catches accidents" in result.stdout


def test_the_key_file_in_notifier_toml_verifies_as_the_environment_does(sent: Workspace) -> None:
    (sent.path / "audit.key").write_text(KEY + "\n")
    (sent.path / "notifier.toml").write_text('[audit]\nkey_file = "audit.key"\n')
    result = sent.run("verify", "r1", env={KEY_ENV: ""})
    assert result.returncode == 0, result.stderr
    assert "run r1: keyed" in result.stdout


def test_a_run_that_is_not_there_is_a_usage_error(sent: Workspace) -> None:
    result = sent.run("verify", "nope", env={KEY_ENV: KEY})
    assert result.returncode == 2
    assert "no run 'nope'" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_keyed_run_is_not_written_on_without_its_key(sent: Workspace) -> None:
    """A cancel of a keyed run awaiting approval, by a process holding another key: its flag
    is set (no worker may start the run), but closing the run would write events, which is
    refused (exit 4), naming the run's key id and the fix: no event is written, and the
    chain stays whole."""
    sent.write_csv("more.csv", make_rows(3, start=10))
    planned = sent.run("send", "more.csv", "--run-id", "r2", "--require-approval",
                       env={KEY_ENV: KEY})  # fmt: skip
    assert planned.returncode == 0, planned.stderr
    before = sent.query("SELECT COUNT(*) FROM events WHERE run_id = 'r2'")
    refused = sent.run("cancel", "r2", env={KEY_ENV: "another key"})
    assert refused.returncode == 4, refused.stdout + refused.stderr
    assert key_id(KEY.encode()) in refused.stderr
    assert KEY_ENV in refused.stderr
    assert sent.query("SELECT COUNT(*) FROM events WHERE run_id = 'r2'") == before
    assert sent.query("SELECT state FROM runs WHERE run_id = 'r2'") == [("awaiting_approval",)]
    assert sent.ledger.run("r2").cancel_requested_at is not None
    assert sent.run("verify", "r2", env={KEY_ENV: KEY}).returncode == 0


@pytest.mark.parametrize("command", [("verify", "r1"), ("send", "more.csv")], ids=" ".join)
def test_an_audit_key_that_is_not_utf8_is_a_usage_error_naming_the_variable(
    sent: Workspace, command: tuple[str, ...]
) -> None:
    """NOTIFIER_AUDIT_KEY holding bytes that are not UTF-8 (a key read from a binary file
    into the environment) is exit 2 naming the variable, never its value, nothing stored."""
    sent.write_csv("more.csv", make_rows(2, start=10))
    runs = sent.ledger.runs()
    # The environment's bytes 0xff 0xfe, as Python hands undecodable bytes to a str.
    result = sent.run(*command, env={KEY_ENV: "\udcff\udcfe"})
    assert result.returncode == 2, result.stdout + result.stderr
    assert KEY_ENV in result.stderr and "UTF-8" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr
    assert sent.ledger.runs() == runs
