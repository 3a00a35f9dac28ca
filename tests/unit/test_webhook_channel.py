"""The webhook channel's wire format and error classes, with httpx2.MockTransport where only
the payload shape matters (docs/design.md sections 6, 7 and 11)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import httpx2
import pytest
import standardwebhooks

from notifier.channels.webhook import WebhookChannel, classify_status, parse_retry_after
from notifier.domain.answers import ChannelError, ErrorKind
from notifier.domain.intent import Intent

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def intent() -> Intent:
    return Intent(
        run_id="run-1",
        seq=7,
        item_id="u7",
        channel="hooks",
        target="zoë@example.com",
        payload={"subject": "Grüße", "body": "Hallo", "data": {"plan": "team"}},
        idempotency_key="ntf1-abc",
        intent_digest="sha256:" + "0" * 64,
    )


def channel(handler: httpx2.MockTransport, **definition: object) -> WebhookChannel:
    return WebhookChannel(
        "hooks", {"type": "webhook", "url": "http://hooks.test/n", **definition}, handler
    )


def test_request_carries_body_key_digest_and_verifiable_signature(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The POST body has the contract's fields; the key and digest travel as headers; the
    Standard Webhooks signature verifies with the secret and fails with another."""
    monkeypatch.setenv("HOOKS_SECRET", SECRET)
    seen: list[httpx2.Request] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        return httpx2.Response(201, json={"id": "dlv_1", "intent_digest": "sha256:" + "0" * 64})

    receipt = channel(httpx2.MockTransport(handler), secret_env="HOOKS_SECRET").send(intent())
    assert receipt.receipt_id == "dlv_1"
    [request] = seen
    body = json.loads(request.content)
    assert body == {
        "to": "zoë@example.com", "subject": "Grüße", "body": "Hallo",
        "data": {"plan": "team"}, "run_id": "run-1", "item_id": "u7",
    }  # fmt: skip
    assert request.headers["Idempotency-Key"] == "ntf1-abc"
    assert request.headers["Notifier-Intent-Digest"] == "sha256:" + "0" * 64
    assert request.headers["webhook-id"] == "ntf1-abc"
    headers = dict(request.headers)
    standardwebhooks.Webhook(SECRET).verify(request.content, headers)
    with pytest.raises(standardwebhooks.WebhookVerificationError):
        standardwebhooks.Webhook("whsec_" + "A" * 32).verify(request.content, headers)


def test_unsigned_without_secret_env() -> None:
    """Without secret_env no signature headers are sent."""
    seen: list[httpx2.Request] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        return httpx2.Response(200, json={"id": 5})

    receipt = channel(httpx2.MockTransport(handler)).send(intent())
    assert receipt.receipt_id is None  # the id is used only when it is a string
    assert "webhook-signature" not in seen[0].headers


def test_missing_secret_variable_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """A secret_env naming an unset variable stops before any request, naming the variable."""
    monkeypatch.delenv("NOPE_SECRET", raising=False)
    with pytest.raises(Exception, match=r"\$NOPE_SECRET"):
        channel(httpx2.MockTransport(lambda r: httpx2.Response(200)), secret_env="NOPE_SECRET")


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (429, ErrorKind.THROTTLED),
        (503, ErrorKind.THROTTLED),
        (408, ErrorKind.UNCERTAIN),
        (500, ErrorKind.UNCERTAIN),
        (502, ErrorKind.UNCERTAIN),
        (504, ErrorKind.UNCERTAIN),
        (303, ErrorKind.UNCERTAIN),
        (301, ErrorKind.UNCERTAIN),
        (307, ErrorKind.UNCERTAIN),
        (409, ErrorKind.IN_PROGRESS),
        (422, ErrorKind.CONFLICT),
        (410, ErrorKind.GONE),
        (400, ErrorKind.PERMANENT),
        (404, ErrorKind.PERMANENT),
    ],
)
def test_status_classes_follow_the_design_table(status: int, kind: ErrorKind) -> None:
    """Each HTTP status maps to the error class of docs/design.md section 7."""
    assert classify_status(status) is kind
    transport = httpx2.MockTransport(
        lambda r: httpx2.Response(status, headers={"Retry-After": "7"})
    )
    with pytest.raises(ChannelError) as caught:
        channel(transport).send(intent())
    assert caught.value.kind is kind
    assert caught.value.http_status == status
    assert caught.value.retry_after == 7.0


def test_retry_after_as_seconds_or_http_date() -> None:
    """Retry-After is read as delay-seconds or as an HTTP-date; garbage is ignored."""
    now = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
    assert parse_retry_after("120", now) == 120.0
    later = format_datetime(now + timedelta(seconds=90), usegmt=True)
    assert parse_retry_after(later, now) == 90.0
    assert parse_retry_after(format_datetime(now - timedelta(hours=1), usegmt=True), now) == 0.0
    assert parse_retry_after("soon", now) is None
    assert parse_retry_after(None, now) is None
    # Digits by Unicode but not the ASCII DIGIT the RFC names: unreadable, never a crash
    # (a superscript two is a digit to str.isdigit and nothing to float).
    assert parse_retry_after("\u00b2", now) is None
    assert parse_retry_after("\u0661\u0662", now) is None


def test_connection_errors_say_whether_the_request_left() -> None:
    """A refused connection is NOT_SENT (safe anywhere); a read timeout after sending is
    UNCERTAIN."""

    def refuse(request: httpx2.Request) -> httpx2.Response:
        raise httpx2.ConnectError("refused", request=request)

    def hang(request: httpx2.Request) -> httpx2.Response:
        raise httpx2.ReadTimeout("slow", request=request)

    with pytest.raises(ChannelError) as refused:
        channel(httpx2.MockTransport(refuse)).send(intent())
    assert refused.value.kind is ErrorKind.NOT_SENT
    with pytest.raises(ChannelError) as timed_out:
        channel(httpx2.MockTransport(hang)).send(intent())
    assert timed_out.value.kind is ErrorKind.UNCERTAIN


def test_query_found_not_found_and_uncertain() -> None:
    """GET status_url: 200 is a receipt with the stored digest, 404 is None, other answers
    raise UNCERTAIN (never a guess)."""
    answers = {
        "/s/k200": httpx2.Response(200, json={"id": "dlv_9", "intent_digest": "sha256:x"}),
        "/s/k404": httpx2.Response(404),
        "/s/k500": httpx2.Response(500),
    }
    transport = httpx2.MockTransport(lambda r: answers[r.url.path])
    hooks = channel(transport, status_url="http://hooks.test/s/{key}")
    assert hooks.queryable
    found = hooks.query("k200")
    assert found is not None and (found.receipt_id, found.intent_digest) == ("dlv_9", "sha256:x")
    assert hooks.query("k404") is None
    with pytest.raises(ChannelError) as caught:
        hooks.query("k500")
    assert caught.value.kind is ErrorKind.UNCERTAIN


def test_urls_from_the_environment_are_named_by_their_variable_and_masked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`url_env` and `status_url_env`: requests go to the variables' URLs; errors name them
    as `$VAR (scheme://…)`, and what the receiver or the HTTP library says is masked of the
    URL and its parts (its path, the token segment in it)."""
    token = "T0kEnInPaTh42"
    monkeypatch.setenv("HOOKS_URL", f"https://hooks.test/services/{token}")
    monkeypatch.setenv("HOOKS_STATUS", f"https://hooks.test/status/{token}/{{key}}")
    seen: list[str] = []

    def echo(request: httpx2.Request) -> httpx2.Response:
        seen.append(str(request.url))
        if request.method == "GET":
            raise httpx2.ReadTimeout(f"no answer from {request.url}", request=request)
        return httpx2.Response(404, text=f"no hook {token} at {request.url.path}")

    hooks = WebhookChannel(
        "hooks",
        {"type": "webhook", "url_env": "HOOKS_URL", "status_url_env": "HOOKS_STATUS"},
        httpx2.MockTransport(echo),
    )
    assert hooks.queryable
    with pytest.raises(ChannelError) as sent:
        hooks.send(intent())
    with pytest.raises(ChannelError) as queried:
        hooks.query("ntf1-abc")
    assert seen == [
        f"https://hooks.test/services/{token}",
        f"https://hooks.test/status/{token}/ntf1-abc",
    ]
    assert str(sent.value).startswith("$HOOKS_URL (https://…): HTTP 404 no hook ***"), sent.value
    assert str(queried.value).startswith("$HOOKS_STATUS (https://…) with ntf1-abc: query failed")
    assert token not in str(sent.value) + str(queried.value), (sent.value, queried.value)


def test_a_url_variable_that_is_not_set_is_a_config_error_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("NOPE_URL", raising=False)
    with pytest.raises(Exception, match=r"NOPE_URL \(named by `url_env`\) is not set"):
        WebhookChannel("hooks", {"type": "webhook", "url_env": "NOPE_URL"})


def test_a_host_name_that_is_the_token_of_a_url_from_the_environment_is_masked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Some services put the credential in the host name itself (a per-endpoint subdomain,
    as request-bin services do): it is masked like a token in the path, alone and as the
    whole host, while ordinary host names (`hooks.test`) stay readable."""
    token = "eo7k2q9x4mwp1zt"
    monkeypatch.setenv("HOOKS_URL", f"https://{token}.m.pipedream.net/")

    def echo(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(404, text=f"no workflow {token} at {request.url.host}")

    hooks = WebhookChannel(
        "hooks", {"type": "webhook", "url_env": "HOOKS_URL"}, httpx2.MockTransport(echo)
    )
    with pytest.raises(ChannelError) as sent:
        hooks.send(intent())
    assert token not in str(sent.value), sent.value
    assert "HTTP 404 no workflow *** at ***" in str(sent.value), sent.value
