"""An smtp `host` written as a URL with a login (`smtp://alice:PW@relay`, or `alice:PW@relay`)
is no host name: no relay can be reached by it, and the password in it would be kept in the
run's channel snapshot and quoted by every "cannot connect" error (stored, reported, in the
JSON log). As a webhook `url` with a user part is, it is refused when the configuration
loads (exit 2, nothing stored, the value not quoted); the login belongs in
`username_env`/`password_env`."""

from __future__ import annotations

import pytest

from ..conftest import Workspace, make_rows
from ..support.net import refusing_port

pytestmark = pytest.mark.timeout(60)
PASSWORD = "SmTpPaSs333"


@pytest.mark.parametrize("form", ["smtp://alice:{pw}@127.0.0.1", "alice:{pw}@127.0.0.1"])
def test_a_password_in_an_smtp_host_reaches_no_table_and_no_output(
    ws: Workspace, form: str
) -> None:
    with refusing_port() as port:
        (ws.path / "notifier.toml").write_text(
            f'[channels.mail]\ntype = "smtp"\nhost = "{form.format(pw=PASSWORD)}"\n'
            f'port = {port}\nsender = "ops@example.com"\ntimeout = 2\n'
            "[retry]\nmax_attempts = 2\nbackoff_base = 0.01\nbackoff_max = 0.02\n"
        )
        ws.write_csv("batch.csv", make_rows(1))
        sent = ws.invoke("send", "batch.csv", "--channel", "mail", "--log-format", "json")
        outputs = [sent.output]
        if ws.db_file.exists():
            for args in (["status", "--json"], ["report"], ["runs", "--json"]):
                outputs.append(ws.invoke(*args).output)
    leaked = [text for text in outputs if PASSWORD in text]
    assert leaked == [], leaked[0]
    if ws.db_file.exists():
        assert PASSWORD.encode() not in ws.stored_bytes()
    assert sent.exit_code == 2, sent.output
    assert "host" in sent.output and "password_env" in sent.output, sent.output
