"""A webhook URL carrying a credential is refused at load (Azure Functions' `code=`, a
gateway's `pwd=`); a URL from `url_env` and the signing secret from `secret_env` never reach
a stored error, a receipt id or an output, whatever spelling the receiver echoes them in
(a query decoded, a user part as Basic credentials, percent-encoded with `/` kept or
lower-case hex)."""

from __future__ import annotations

import base64
from collections.abc import Callable
from contextlib import AbstractContextManager
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qsl, quote, urlsplit

import pytest

from ..conftest import Workspace, make_rows
from ..support.answering import answering

pytestmark = pytest.mark.timeout(60)
TOKEN = "WhToKeN777"


def refusing_receiver(says: Callable[[BaseHTTPRequestHandler], str]) -> AbstractContextManager[int]:
    """A receiver that answers every POST 400 with what `says` makes of the request."""
    return answering(400, says)


def outputs_after_send(ws: Workspace, env: dict[str, str]) -> list[str]:
    ws.write_csv("batch.csv", make_rows(1))
    sent = ws.invoke("send", "batch.csv", "--channel", "hooks", env=env)
    return [sent.output, ws.invoke("status", "--json").output,
            ws.invoke("report", "--format", "json").output]  # fmt: skip


@pytest.mark.parametrize(
    "query",
    [
        # Azure Functions' function key: https://APP.azurewebsites.net/api/HOOK?code=KEY
        pytest.param(f"code={TOKEN}", id="azure-functions-code"),
        # SMS/HTTP gateways' password parameter.
        pytest.param(f"user=ops&pwd={TOKEN}", id="pwd"),
    ],
)
def test_a_webhook_url_carrying_a_credential_is_refused_at_load(ws: Workspace, query: str) -> None:
    (ws.path / "notifier.toml").write_text(
        f'[channels.hooks]\ntype = "webhook"\nurl = "http://127.0.0.1:9/api/hook?{query}"\n'
    )
    ws.write_csv("batch.csv", make_rows(1))
    result = ws.invoke("send", "batch.csv", "--channel", "hooks", "--require-approval")
    assert TOKEN.encode() not in ws.stored_bytes()
    assert result.exit_code == 2, result.output


# A base64 signature in the query, percent-encoded as a URL must carry it ('+' and '=').
SIG = f"{TOKEN}Ab+Cd/Ef="


def echo_decoded_query(request: BaseHTTPRequestHandler) -> str:
    """As a framework's `request.args` shows it: the query decoded."""
    return f"bad request: {dict(parse_qsl(urlsplit(request.path).query))}"


def echo_authorization(request: BaseHTTPRequestHandler) -> str:
    """As an echo/debug receiver (httpbin-like) shows the headers it got."""
    return f"unexpected Authorization: {request.headers.get('Authorization')}"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        pytest.param(
            "http://127.0.0.1:{port}/hook?sv=1&sig=" + quote(SIG, safe=""),
            echo_decoded_query,
            id="percent-encoded-query-echoed-decoded",
        ),
        pytest.param(
            "http://ops:" + TOKEN + "@127.0.0.1:{port}/hook",
            echo_authorization,
            id="user-part-echoed-as-basic-auth",
        ),
    ],
)
def test_a_url_from_url_env_is_never_stored_in_the_spelling_a_receiver_echoes(
    ws: Workspace, url: str, says: Callable[[BaseHTTPRequestHandler], str]
) -> None:
    (ws.path / "notifier.toml").write_text(
        '[channels.hooks]\ntype = "webhook"\nurl_env = "HOOKS_URL"\ntimeout = 5\n'
        "[retry]\nmax_attempts = 1\n"
    )
    with refusing_receiver(says) as port:
        outputs = outputs_after_send(ws, {"HOOKS_URL": url.format(port=port)})
    # The token as written, and as Basic credentials carry it (base64 of user:password).
    forms = (TOKEN, base64.b64encode(f"ops:{TOKEN}".encode()).decode())
    leaked = [t for t in outputs for form in forms if form in t]
    assert leaked == [], leaked[0]
    assert [form for form in forms if form.encode() in ws.stored_bytes()] == []


SECRET = "whsec_MfKQ9r8G/YqrTwj+PD8ILPZIo2LaLaSw"
KEY_HEAD = "MfKQ9r8G"


@pytest.mark.parametrize(
    "spelt",
    [
        # Python's urllib.parse.quote as called by default (safe='/'): '/' kept, '+' -> %2B.
        pytest.param(quote, id="percent-encoded-slash-kept"),
        # .NET's HttpUtility.UrlEncode: lower-case hex.
        pytest.param(
            lambda s: quote(s, safe="").replace("%2F", "%2f").replace("%2B", "%2b"),
            id="percent-encoded-lower-hex",
        ),
    ],
)
def test_a_signing_secret_a_receiver_echoes_is_masked_in_every_percent_encoding(
    ws: Workspace, spelt: Callable[[str], str]
) -> None:
    (ws.path / "notifier.toml").write_text(
        '[channels.hooks]\ntype = "webhook"\nurl_env = "HOOKS_URL"\ntimeout = 5\n'
        'secret_env = "HOOKS_SECRET"\n[retry]\nmax_attempts = 1\n'
    )
    with refusing_receiver(lambda _: f"expected signature key {spelt(SECRET)}") as port:
        outputs = outputs_after_send(
            ws, {"HOOKS_URL": f"http://127.0.0.1:{port}/n", "HOOKS_SECRET": SECRET}
        )
    assert [t for t in outputs if KEY_HEAD in t] == []
    assert KEY_HEAD.encode() not in ws.stored_bytes()


def accepting_receiver() -> AbstractContextManager[int]:
    """A receiver that accepts every POST, its receipt id naming the path it was sent to."""
    return answering(200, lambda request: f'{{"id": "rcpt{request.path}"}}')


def test_a_url_from_url_env_echoed_in_a_receipt_id_is_never_stored(ws: Workspace) -> None:
    (ws.path / "notifier.toml").write_text(
        '[channels.hooks]\ntype = "webhook"\nurl_env = "HOOKS_URL"\ntimeout = 5\n'
    )
    with accepting_receiver() as port:
        url = f"http://127.0.0.1:{port}/services/T0/B0/{TOKEN}"
        outputs = outputs_after_send(ws, {"HOOKS_URL": url})
    assert [t for t in outputs if TOKEN in t] == []
    assert TOKEN.encode() not in ws.stored_bytes()
