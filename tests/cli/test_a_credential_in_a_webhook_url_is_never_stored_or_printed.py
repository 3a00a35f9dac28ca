"""Secrets come only from the environment; never in the database, logs or reports. A
webhook `url` (or `status_url`) in notifier.toml that carries a credential (a user part,
`user:pw@`; a query parameter named like one, `?token=`) is refused when the configuration
loads, exit 2, naming the channel, the setting and the fix without quoting the URL, as an
Apprise `urls` entry is. A URL whose very path is the secret comes from the environment
(`url_env`, `status_url_env`): the run's snapshot keeps the variable's name, and no stored
error, report, status, log line or export shows the URL or a part of it."""

from __future__ import annotations

import pytest

from ..conftest import Workspace, make_rows
from ..support.net import refusing_port

pytestmark = pytest.mark.timeout(60)
PASSWORD = "UrLpAsS111"
TOKEN = "UrLtOkEn222"


def test_a_credential_in_a_webhook_url_reaches_no_table_and_no_output(ws: Workspace) -> None:
    with refusing_port() as port:
        (ws.path / "notifier.toml").write_text(
            '[channels.hooks]\ntype = "webhook"\n'
            f'url = "http://alice:{PASSWORD}@127.0.0.1:{port}/n?token={TOKEN}"\n'
            "timeout = 2\n[retry]\nmax_attempts = 2\nbackoff_base = 0.01\nbackoff_max = 0.02\n"
        )
        ws.write_csv("batch.csv", make_rows(2))
        sent = ws.invoke("send", "batch.csv", "--channel", "hooks", "--log-format", "json")
        outputs = [sent.output]
        if sent.exit_code != 2:  # not refused at load: then nothing may show it anywhere
            for args in (["status"], ["status", "--json"], ["report"],
                         ["report", "--format", "csv"], ["runs", "--json"],
                         ["metrics"]):  # fmt: skip
                outputs.append(ws.invoke(*args).output)
    leaked = [text for text in outputs if PASSWORD in text or TOKEN in text]
    assert leaked == [], leaked[0]
    assert PASSWORD.encode() not in ws.stored_bytes()
    assert TOKEN.encode() not in ws.stored_bytes()


@pytest.mark.parametrize(
    ("url", "setting"),
    [
        pytest.param(f"http://alice:{PASSWORD}@127.0.0.1:9/n", "url", id="password"),
        pytest.param(f"http://{TOKEN}@127.0.0.1:9/n", "url", id="bare-user-part"),
        pytest.param(f"http://127.0.0.1:9/n?api_key={TOKEN}", "url", id="api_key"),
        pytest.param(f"http://127.0.0.1:9/n?x=1&sig={TOKEN}", "url", id="sig"),
        pytest.param(f"http://127.0.0.1:9/n/{{key}}?auth={TOKEN}", "status_url", id="status"),
    ],
)
def test_a_url_carrying_a_credential_is_refused_at_load_naming_the_fix(
    ws: Workspace, url: str, setting: str
) -> None:
    """Exit 2 before anything is stored, naming the channel, the setting and `*_env`, the
    URL not quoted; a run planned with --require-approval (no channel built) likewise."""
    extra = f'{setting} = "{url}"\n'
    if setting != "url":
        extra = 'url = "http://127.0.0.1:9/n"\n' + extra
    (ws.path / "notifier.toml").write_text(f'[channels.hooks]\ntype = "webhook"\n{extra}')
    ws.write_csv("batch.csv", make_rows(1))
    for args in (["send", "batch.csv"], ["send", "batch.csv", "--require-approval"]):
        result = ws.invoke(*args, "--channel", "hooks")
        assert result.exit_code == 2, result.output
        assert "[channels.hooks]" in result.output and f"`{setting}`" in result.output
        assert f"`{setting}_env`" in result.output, result.output
        assert PASSWORD not in result.output and TOKEN not in result.output, result.output
        assert "Traceback" not in result.output
    assert not ws.has_database()


def test_a_url_from_the_environment_is_never_stored_and_named_by_its_variable(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`url_env` and `status_url_env`: the snapshot holds the variables' names; every stored
    error names the URL by its variable, never by a part of its value."""
    with refusing_port() as port:
        monkeypatch.setenv("HOOKS_URL", f"http://127.0.0.1:{port}/services/T0/B0/{TOKEN}")
        monkeypatch.setenv("HOOKS_STATUS", f"http://127.0.0.1:{port}/s/{PASSWORD}/{{key}}")
        (ws.path / "notifier.toml").write_text(
            '[channels.hooks]\ntype = "webhook"\nurl_env = "HOOKS_URL"\n'
            'status_url_env = "HOOKS_STATUS"\ntimeout = 2\nquery_delay = 0\n'
            "[retry]\nmax_attempts = 2\nbackoff_base = 0.01\nbackoff_max = 0.02\n"
        )
        ws.write_csv("batch.csv", make_rows(2))
        sent = ws.invoke("send", "batch.csv", "--channel", "hooks", "--log-format", "json")
        outputs = [sent.output]
        for args in (["status"], ["status", "--json"], ["report"],
                     ["report", "--format", "csv"], ["runs", "--json"],
                     ["metrics"], ["resume"]):  # fmt: skip
            outputs.append(ws.invoke(*args).output)
    assert "$HOOKS_URL (http://…): cannot connect" in sent.output, sent.output
    leaked = [text for text in outputs if PASSWORD in text or TOKEN in text]
    assert leaked == [], leaked[0]
    assert PASSWORD.encode() not in ws.stored_bytes()
    assert TOKEN.encode() not in ws.stored_bytes()
    assert b"HOOKS_URL" in ws.stored_bytes() and b"HOOKS_STATUS" in ws.stored_bytes()
    exported = ws.invoke("export", "--to", str(ws.path / "audit.db"))
    assert exported.exit_code == 0, exported.output
    audit = (ws.path / "audit.db").read_bytes()
    assert TOKEN.encode() not in audit and PASSWORD.encode() not in audit
    assert b"$HOOKS_URL (http://" in audit  # the stored errors name the variable


def test_a_url_variable_that_is_not_set_or_not_a_url_exits_2_without_showing_it(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    (ws.path / "notifier.toml").write_text(
        '[channels.hooks]\ntype = "webhook"\nurl_env = "HOOKS_URL"\n'
    )
    ws.write_csv("batch.csv", make_rows(1))
    monkeypatch.delenv("HOOKS_URL", raising=False)
    unset = ws.invoke("send", "batch.csv", "--channel", "hooks")
    assert unset.exit_code == 2 and "HOOKS_URL (named by `url_env`) is not set" in unset.output
    monkeypatch.setenv("HOOKS_URL", f"hooks.example.com/{TOKEN}")
    bad = ws.invoke("send", "batch.csv", "--channel", "hooks")
    assert bad.exit_code == 2 and "$HOOKS_URL (named by `url_env`)" in bad.output, bad.output
    assert TOKEN not in bad.output
    assert not ws.has_database()
