"""An smtp `host` holding a space or a comma (two relays listed, a name mistyped) names no
relay: accepted, every send of the run would fail to connect, and the run would pause with
its channel "down" (exit 3) after it was stored. Refused when the configuration loads
instead (exit 2, `host` named, nothing stored)."""

from __future__ import annotations

import pytest

from ..conftest import Workspace, make_rows

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    "host", ["relay example.com", " relay.example.com", "relay1.example.com,relay2.example.com"]
)
def test_an_smtp_host_with_a_space_or_a_comma_is_exit_2_and_stores_nothing(
    ws: Workspace, host: str
) -> None:
    (ws.path / "notifier.toml").write_text(
        f'[channels.mail]\ntype = "smtp"\nhost = "{host}"\nport = 2525\n'
        'sender = "ops@example.com"\ntimeout = 2\n'
    )
    ws.write_csv("batch.csv", make_rows(1))
    sent = ws.invoke("send", "batch.csv", "--channel", "mail")
    assert sent.exit_code == 2, sent.output
    assert "host" in sent.output, sent.output
    assert "Traceback" not in sent.output
    assert not ws.db_file.exists()
