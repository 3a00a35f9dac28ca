"""A webhook URL from `url_env` whose query carries a parameter named like a credential
(`token=`, `key=`, `sig=`: what a URL in notifier.toml is refused for) has that parameter's
value masked in whatever a receiver answers, whatever the value looks like: twelve letters
with no digit, or twelve digits with no letter, read to the masking of path segments as
ordinary words, and were stored and printed when a receiver refused the request quoting
the token it did not know."""

from __future__ import annotations

import pytest

from ..conftest import Workspace, make_rows
from ..support.answering import answering

pytestmark = [pytest.mark.timeout(60), pytest.mark.both_stores]


@pytest.mark.parametrize(
    ("query", "token"),
    [
        # A random 12-character token of letters only (one in eight of them has no digit).
        pytest.param("token={}", "QxZpLmNoRtYw", id="letters-only"),
        # A numeric API key.
        pytest.param("v=2&api_key={}", "839201745512", id="digits-only"),
        # Short, as some services' access codes are.
        pytest.param("sig={}", "a1B2c", id="short"),
    ],
)
def test_a_credential_parameter_a_receiver_quotes_is_masked_everywhere(
    ws: Workspace, query: str, token: str
) -> None:
    (ws.path / "notifier.toml").write_text(
        '[channels.hooks]\ntype = "webhook"\nurl_env = "HOOKS_URL"\ntimeout = 5\n'
        "[retry]\nmax_attempts = 1\n"
    )
    ws.write_csv("batch.csv", make_rows(1))
    with answering(401, lambda _: f'{{"error": "unknown access token {token}"}}') as port:
        url = f"http://127.0.0.1:{port}/hooks/alerts?{query.format(token)}"
        sent = ws.invoke(
            "send", "batch.csv", "--channel", "hooks", "--log-format", "json",
            env={"HOOKS_URL": url},
        )  # fmt: skip
    assert sent.exit_code == 3, sent.output
    assert "HTTP 401" in sent.output and "unknown access token ***" in sent.output
    outputs = [sent.output]
    for args in (["status", "--json"], ["report", "--format", "json"], ["runs", "--json"]):
        outputs.append(ws.invoke(*args).output)
    assert [text for text in outputs if token in text] == []
    exported = ws.invoke("export", "--to", str(ws.path / "audit.db"))
    assert exported.exit_code == 0, exported.output
    assert token.encode() not in (ws.path / "audit.db").read_bytes()
    if ws.store == "sqlite":
        assert token.encode() not in ws.stored_bytes()
