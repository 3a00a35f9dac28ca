"""A webhook signing secret a receiver quotes back is masked before the error is stored,
printed or reported — also when the receiver's JSON encoder escapes the '/' of its base64
(`\\/`, as PHP's json_encode and others do by default), which leaves the secret as readable
as before but no longer equal, byte for byte, to the text redact.py looks for."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from ..conftest import Workspace, make_rows

pytestmark = pytest.mark.timeout(60)
SECRET = "whsec_SeKr//Et/+AAAAAAAAAAAAAAAAAAAAAA"
KEY_HEAD = "SeKr"


@pytest.fixture
def escaping_receiver() -> Iterator[int]:
    class Echo(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            text = json.dumps({"error": f"signature does not match secret {SECRET}"})
            body = text.replace("/", "\\/").encode()
            self.send_response(401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_port
    finally:
        server.shutdown()


def test_a_json_escaped_echo_of_the_signing_secret_is_masked(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch, escaping_receiver: int
) -> None:
    monkeypatch.setenv("HOOKS_SECRET", SECRET)
    (ws.path / "notifier.toml").write_text(
        '[channels.hooks]\ntype = "webhook"\n'
        f'url = "http://127.0.0.1:{escaping_receiver}/n"\n'
        'idempotent = true\ntimeout = 5\nsecret_env = "HOOKS_SECRET"\n'
    )
    ws.write_csv("batch.csv", make_rows(1))
    sent = ws.invoke("send", "batch.csv", "--channel", "hooks")
    assert sent.exit_code == 3, sent.output
    outputs = [sent.output, ws.invoke("report", "--format", "json").output]
    assert [text for text in outputs if KEY_HEAD in text] == []
    stored = b"".join(p.read_bytes() for p in Path(ws.path).glob("receipts.db*"))
    assert KEY_HEAD.encode() not in stored
