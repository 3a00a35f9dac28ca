"""A webhook URL's ordinary words are neither refused as credentials (`?lang_code=`,
`?keyword=`, `?country_code=`; a parameter with `key` as a word of its own, `?sort_key=`,
is refused, as `?api_key=` is: the two cannot be told apart) nor masked out of what is
stored: a receipt id holding a word of a `url_env` URL (`notify`) is kept as the receiver
gave it."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ..conftest import Workspace

pytestmark = [pytest.mark.timeout(60)]


def _config(url_line: str) -> str:
    return (
        '[channels.hooks]\ntype = "webhook"\n' + url_line + "\nidempotent = true\n"
        "timeout = 5\n[retry]\nmax_attempts = 1\nbackoff_base = 0.02\nbackoff_max = 0.1\n"
    )


@pytest.mark.parametrize(
    "query",
    ["lang_code=en", "zip_code=75001", "keyword=alerts", "country_code=FR", "bypass_cache=1"],
)
def test_an_ordinary_query_parameter_is_not_refused_as_a_credential(
    ws: Workspace, query: str
) -> None:
    """Promise: refusals only for what may be a secret. `?lang_code=en` is no credential."""
    (ws.path / "notifier.toml").write_text(
        _config(f'url = "http://127.0.0.1:9/notifications?{query}"')
    )
    ws.write_csv("b.csv", [["id", "to", "subject", "body"], ["a1", "ann@example.com", "s", "b"]])
    result = ws.invoke("send", "b.csv", "--channel", "hooks", "--dry-run")
    assert "credential" not in result.output, result.output
    assert result.exit_code == 0, result.output


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", 0))
        self.rfile.read(length)
        body = json.dumps({"id": "notify-receipt-42"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_a_receipt_is_stored_as_the_receiver_gave_it_not_masked_by_a_word_of_the_url(
    ws: Workspace,
) -> None:
    """Promise: what the tool shows is what happened. The URL (from url_env, no secret in
    it at all: path /notify/incoming) has a 6-letter segment `notify`; the receiver's receipt
    id `notify-receipt-42` is stored and shown as `***-receipt-42`."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/notify/incoming"
        (ws.path / "notifier.toml").write_text(_config('url_env = "HOOK_URL"'))
        ws.write_csv(
            "b.csv", [["id", "to", "subject", "body"], ["a1", "ann@example.com", "s", "b"]]
        )
        sent = ws.invoke("send", "b.csv", "--channel", "hooks", env={"HOOK_URL": url})
        assert sent.exit_code == 0, sent.output
        report = ws.invoke("report", "--format", "json", env={"HOOK_URL": url})
    finally:
        server.shutdown()
    assert "notify-receipt-42" in report.output, report.output
