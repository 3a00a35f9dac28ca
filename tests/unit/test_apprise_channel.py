"""AppriseChannel against a stdlib HTTP server on 127.0.0.1 through Apprise's json:// plugin:
delivery with per-row `{to}` routing, failure classification, URLs from the environment,
and configuration errors that never echo a secret."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

from notifier.channels.apprise import AppriseChannel, mask_url, split_urls
from notifier.channels.base import ChannelConfigError, Withheld
from notifier.domain.answers import ChannelError, ErrorKind
from notifier.domain.intent import Intent, idempotency_key, intent_digest, make_payload

pytest.importorskip("apprise")  # the optional extra; notifier.channels.apprise loads it lazily
# Apprise's own import of the stdlib imghdr module warns on 3.11; not this project's concern.
pytestmark = pytest.mark.filterwarnings("ignore:'imghdr' is deprecated:DeprecationWarning")


@dataclass
class Request:
    path: str
    query: dict[str, list[str]]
    document: dict[str, Any]


class RecordingServer(ThreadingHTTPServer):
    """Records every POST; answers with `status`."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.requests: list[Request] = []
        self.status = 200

    @property
    def port(self) -> int:
        port: int = self.server_address[1]
        return port


class _Handler(BaseHTTPRequestHandler):
    disable_nagle_algorithm = True

    def do_POST(self) -> None:
        server = self.server
        assert isinstance(server, RecordingServer)
        length = int(self.headers.get("Content-Length") or 0)
        document = json.loads(self.rfile.read(length) or b"{}")
        parts = urlsplit(self.path)
        server.requests.append(Request(parts.path, parse_qs(parts.query), document))
        self.send_response(server.status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep test output clean


@dataclass
class Http:
    server: RecordingServer
    thread: threading.Thread
    extra: list[RecordingServer] = field(default_factory=list)

    @property
    def base(self) -> str:
        return f"json://127.0.0.1:{self.server.port}"


@pytest.fixture
def http(monkeypatch: pytest.MonkeyPatch) -> Iterator[Http]:
    """A recording HTTP server on 127.0.0.1; proxies from the environment are disabled so
    requests can only go to it."""
    for variable in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    server = RecordingServer()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield Http(server, thread)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def make_intent(
    target: str = "alice+ops@example.com", subject: str = "Hello", body: str = "Body text"
) -> Intent:
    payload = make_payload(subject, body, {})
    return Intent(
        run_id="run-1",
        seq=1,
        item_id="item-1",
        channel="alerts",
        target=target,
        payload=payload,
        idempotency_key=idempotency_key("run-1", "0123456789abcdef", "item-1", target),
        intent_digest=intent_digest("alerts", target, payload),
    )


def test_delivers_title_and_body_with_to_substituted(http: Http) -> None:
    """The subject and body arrive as the JSON title and message, at the configured path,
    with `{to}` replaced by the row's target in a GET parameter (`?-to=`) and in the path."""
    channel = AppriseChannel(
        "alerts",
        {"type": "apprise", "urls": [f"{http.base}/notify/{{to}}?-to={{to}}"], "timeout": 5},
    )
    intent = make_intent(subject="Grüße ✓", body="Line one\nZeile zwei: äöü")
    receipt = channel.send(intent)
    channel.close()

    assert receipt.receipt_id == f"apprise:{intent.idempotency_key}"
    assert len(http.server.requests) == 1
    request = http.server.requests[0]
    assert request.document["title"] == "Grüße ✓"
    assert request.document["message"] == "Line one\nZeile zwei: äöü"
    assert request.query["to"] == ["alice+ops@example.com"]
    assert unquote(request.path) == "/notify/alice+ops@example.com"


def test_the_senders_last_check_withholds_every_url(http: Http) -> None:
    """The sender's last check (`ready`) is asked before the first URL is notified: when it
    says no, the send raises Withheld and no URL gets anything (never a partial delivery)."""
    channel = AppriseChannel("alerts", {"urls": [f"{http.base}/first", f"{http.base}/second"]})
    with pytest.raises(Withheld) as withheld:
        channel.send(make_intent(), lambda: "its send window closed")
    channel.close()
    assert withheld.value.reason == "its send window closed"
    assert http.server.requests == []


def test_server_error_is_uncertain_and_apprise_stays_quiet(
    http: Http, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """A 500 from the service is UNCERTAIN (it may have acted on the request), and Apprise
    writes nothing to stdout/stderr nor logs warnings about it."""
    http.server.status = 500
    channel = AppriseChannel("alerts", {"urls": [f"{http.base}/notify"]})
    with caplog.at_level(logging.WARNING), pytest.raises(ChannelError) as info:
        channel.send(make_intent())
    assert info.value.kind is ErrorKind.UNCERTAIN
    assert len(http.server.requests) == 1
    out, err = capfd.readouterr()
    assert out == ""
    assert err == ""
    assert [r for r in caplog.records if r.name.startswith("apprise")] == []


def test_urls_env_is_read_from_the_environment(http: Http, monkeypatch: pytest.MonkeyPatch) -> None:
    """`urls_env` names a variable holding several URLs separated by commas/whitespace;
    every one of them is notified."""
    monkeypatch.setenv("TEST_APPRISE_URLS", f"{http.base}/first?-to={{to}}, {http.base}/second\n")
    channel = AppriseChannel("alerts", {"urls_env": "TEST_APPRISE_URLS"})
    channel.send(make_intent(target="bob@example.com"))
    paths = sorted(r.path for r in http.server.requests)
    assert paths == ["/first", "/second"]
    first = next(r for r in http.server.requests if r.path == "/first")
    assert first.query["to"] == ["bob@example.com"]


def test_missing_urls_env_variable_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """An unset `urls_env` variable fails at construction, naming the variable."""
    monkeypatch.delenv("TEST_APPRISE_MISSING", raising=False)
    with pytest.raises(ChannelConfigError, match="TEST_APPRISE_MISSING"):
        AppriseChannel("alerts", {"urls_env": "TEST_APPRISE_MISSING"})


@pytest.mark.parametrize("url", ["json://", "nosuchservice://host/path", "not a url at all"])
def test_invalid_url_is_a_config_error(url: str) -> None:
    """A URL Apprise cannot parse or load is refused at construction."""
    with pytest.raises(ChannelConfigError, match="Apprise cannot use"):
        AppriseChannel("alerts", {"urls": [url]})


def test_invalid_url_from_environment_is_never_echoed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bad URL from `urls_env` is named by its position and scheme only: its token-bearing
    parts never appear in the error."""
    monkeypatch.setenv("TEST_APPRISE_URLS", "nosuchservice://SeCrEtToKeN123/chat")
    with pytest.raises(ChannelConfigError) as info:
        AppriseChannel("alerts", {"urls_env": "TEST_APPRISE_URLS"})
    assert "SeCrEtToKeN123" not in str(info.value)
    assert "entry 1 of $TEST_APPRISE_URLS" in str(info.value)


@pytest.mark.parametrize(
    "url",
    ["json://user:hunter2-secret@127.0.0.1:9/notify", "json://127.0.0.1:9/n?token=hunter2-secret"],
)
def test_secret_in_toml_urls_is_refused_without_echoing_it(url: str) -> None:
    """A password or token written into `urls` (which is snapshotted into the database) is
    refused with a pointer to `urls_env`, and the secret is masked in the message."""
    with pytest.raises(ChannelConfigError, match="urls_env") as info:
        AppriseChannel("alerts", {"urls": [url]})
    assert "hunter2-secret" not in str(info.value)


def test_no_urls_is_a_config_error() -> None:
    """A definition with neither `urls` nor `urls_env` says to set one of them."""
    with pytest.raises(ChannelConfigError, match="urls_env"):
        AppriseChannel("alerts", {"type": "apprise"})


def test_query_is_uncertain_and_flags_are_false(http: Http) -> None:
    """Apprise cannot be asked: query raises UNCERTAIN; the channel is neither idempotent
    nor queryable."""
    channel = AppriseChannel("alerts", {"urls": [f"{http.base}/notify"]})
    assert channel.idempotent is False
    assert channel.queryable is False
    with pytest.raises(ChannelError) as info:
        channel.query("ntf1-0123")
    assert info.value.kind is ErrorKind.UNCERTAIN


def test_url_helpers_split_and_mask() -> None:
    """Commas split URLs only before a new scheme; masking keeps scheme and host, hides
    credentials, paths and token-like hosts."""
    assert split_urls("json://a/b, json://c/d?to=x,y\ntgram://t/c,") == [
        "json://a/b",
        "json://c/d?to=x,y",
        "tgram://t/c",
    ]
    assert mask_url("json://user:pw@hooks.example.com:8080/a/b?c=d") == (
        "json://***@hooks.example.com:8080/…"
    )
    assert mask_url("tgram://123456:AAbbCC/chat") == "tgram://***/…"
