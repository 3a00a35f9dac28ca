"""An Apprise `urls` entry in notifier.toml that embeds a credential is refused when the file
loads (exit 2, the entry not quoted), before any run is planned: a run's channel definitions
are copied into its database, so the token would be stored. `urls_env` is for such URLs.
Refused: a user part (a password, or a token alone: ntfy's `tk_…@`), a `BOT:TOKEN` where a
host and port go (Telegram), a query parameter named like a credential, Apprise's header
parameters (`+Authorization`, `-X-Api-Key`, `+Cookie`). A token in the path
(`discord://ID/TOKEN`) cannot be told from a path: the residual docs/guarantees.md names."""

from __future__ import annotations

import pytest

from ..conftest import Workspace, make_rows

pytest.importorskip("apprise")
pytestmark = pytest.mark.timeout(60)
TOKEN = "ApSeKrEt333"


@pytest.mark.parametrize(
    "url",
    [
        pytest.param(f"tgram://123456789:{TOKEN}/12345", id="telegram-bot-token"),
        pytest.param(f"json://127.0.0.1:9/hooks?-Authorization=Bearer%20{TOKEN}", id="header"),
        pytest.param(f"json://127.0.0.1:9/hooks?+X-Api-Key={TOKEN}", id="api-key-header"),
        pytest.param(f"mailto://ops:{TOKEN}@127.0.0.1:2525", id="user-part"),
        pytest.param(f"json://127.0.0.1:9/hooks?token={TOKEN}", id="query"),
        pytest.param(f"ntfys://tk_{TOKEN}@ntfy.sh/alerts", id="token-as-user-part"),
        pytest.param(f"pover://u{TOKEN}@a{TOKEN}", id="pushover-user-key-and-token"),
        pytest.param(f"json://127.0.0.1:9/hooks?+Cookie=session%3D{TOKEN}", id="cookie-header"),
    ],
)
def test_a_credential_in_a_urls_entry_is_refused_and_never_stored(ws: Workspace, url: str) -> None:
    """Refused at load, by `send` and by `send --require-approval` (which plans without
    building the channel): nothing stored, the token nowhere in the output."""
    (ws.path / "notifier.toml").write_text(f'[channels.ap]\ntype = "apprise"\nurls = ["{url}"]\n')
    ws.write_csv("batch.csv", make_rows(1))
    for extra in ([], ["--require-approval"]):
        result = ws.invoke("send", "batch.csv", "--channel", "ap", *extra)
        assert result.exit_code == 2, result.output
        assert "urls_env" in result.output, result.output
        assert TOKEN not in result.output, result.output
    assert TOKEN.encode() not in ws.stored_bytes()


@pytest.mark.parametrize(
    "url",
    [
        "json://127.0.0.1:9/notifications",
        "json://[::1]:9/notifications",
        "mailto://127.0.0.1:2525/?from=ops@example.com&to={to}",
    ],
)
def test_a_urls_entry_without_a_credential_is_accepted(ws: Workspace, url: str) -> None:
    """A host, a port, a path and plain parameters: planned (awaiting approval)."""
    (ws.path / "notifier.toml").write_text(f'[channels.ap]\ntype = "apprise"\nurls = ["{url}"]\n')
    ws.write_csv("batch.csv", make_rows(1))
    planned = ws.invoke("send", "batch.csv", "--channel", "ap", "--require-approval")
    assert planned.exit_code == 0, planned.output
