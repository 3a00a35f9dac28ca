"""Secrets come only from the environment: notifier.toml names the variables that hold them
(`secret_env`, `username_env`, `password_env`, `urls_env`, `url_env`). A value written there that
cannot be an environment variable's name (`[A-Za-z_][A-Za-z0-9_]*`), or a `secret_env` that
starts with `whsec_` (a Standard Webhooks secret, not the name of one), is refused when the
configuration loads, exit 2, naming the channel and the setting without quoting the value;
nothing is stored, not even by a run planned with --require-approval (which does not build
its channels)."""

from __future__ import annotations

import pytest

from ..conftest import Workspace, make_rows

pytestmark = pytest.mark.timeout(60)
TOKEN = "MiSpLaCeD123"

SECTIONS = [
    pytest.param(
        f'type = "webhook"\nurl = "http://127.0.0.1:9/n"\nsecret_env = "whsec_{TOKEN}+/AA"\n',
        id="webhook-secret_env",
    ),
    pytest.param(
        f'type = "webhook"\nurl_env = "https://hooks.example.com/services/T0/B0/{TOKEN}"\n',
        id="webhook-url_env",
    ),
    pytest.param(
        'type = "smtp"\nhost = "127.0.0.1"\nport = 9\nsender = "ops@example.com"\n'
        f'username_env = "HOME"\npassword_env = "p@ss {TOKEN}"\n',
        id="smtp-password_env",
    ),
    pytest.param(
        f'type = "apprise"\nurls_env = "tgram://123456789:{TOKEN}/12345"\n',
        id="apprise-urls_env",
    ),
]


@pytest.mark.parametrize("section", SECTIONS)
def test_a_value_in_a_variable_name_setting_is_neither_echoed_nor_stored(
    ws: Workspace, section: str
) -> None:
    if "apprise" in section:
        pytest.importorskip("apprise")
    (ws.path / "notifier.toml").write_text(f"[channels.c]\n{section}")
    ws.write_csv("batch.csv", make_rows(1))
    sent = ws.invoke("send", "batch.csv", "--channel", "c")
    assert sent.exit_code == 2, sent.output
    assert TOKEN not in sent.output, sent.output
    planned = ws.invoke("send", "batch.csv", "--channel", "c", "--require-approval")
    assert TOKEN not in planned.output, planned.output
    assert TOKEN.encode() not in ws.stored_bytes()
