"""HTTP webhooks over httpx2 (the client the anthropic SDK brings).

The idempotency key travels as `Idempotency-Key` and as the Standard Webhooks `webhook-id`
(the same on every retry, as the spec asks); the intent digest as `Notifier-Intent-Digest`,
so a careful receiver can refuse a different payload under a known key. With `status_url`
the channel is queryable: GET it → 200 found, 404 not found, anything else uncertain.
"""

from __future__ import annotations

import binascii
import email.utils
import json
import os
from datetime import UTC, datetime
from typing import Any

import httpx2
from standardwebhooks import Webhook

from .. import __version__
from ..intent import Intent
from .base import ChannelConfigError, ChannelError, ErrorKind, Receipt

DEFAULT_TIMEOUT_S = 10.0
# An ASSUMPTION about the receiver, not a fact: one that has not committed a request within
# timeout + query_delay after it left never will. Before that, a 404 from status_url does not
# prove "not sent" (the receiver may still be working on the request that timed out).
DEFAULT_QUERY_DELAY_S = 5.0


class WebhookChannel:
    thread_safe = True  # httpx2's Client pools connections safely across threads

    def __init__(
        self,
        name: str,
        definition: dict[str, Any],
        transport: httpx2.BaseTransport | None = None,
    ) -> None:
        self.name = name
        self.url = str(definition["url"])
        self.status_url: str | None = definition.get("status_url")
        self.idempotent = bool(definition.get("idempotent", False))
        self.queryable = self.status_url is not None
        self._signer = _signer(name, definition.get("secret_env"))
        timeout = float(definition.get("timeout", DEFAULT_TIMEOUT_S))
        self.timeout_s = timeout
        self.query_delay_s = float(definition.get("query_delay", DEFAULT_QUERY_DELAY_S))
        self._client = httpx2.Client(
            timeout=httpx2.Timeout(timeout),
            # One keep-alive connection per concurrent sender is plenty.
            limits=httpx2.Limits(max_connections=64, max_keepalive_connections=64),
            # Never route through a proxy from the environment: the URL is exactly where the
            # run's snapshot says the notifications go.
            trust_env=False,
            follow_redirects=False,
            transport=transport,
            headers={"User-Agent": f"notifier/{__version__}"},
        )

    def send(self, intent: Intent) -> Receipt:
        body = json.dumps(
            {
                "to": intent.target,
                "subject": intent.subject,
                "body": intent.body,
                "data": dict(intent.data),
                "run_id": intent.run_id,
                "item_id": intent.item_id,
            },
            ensure_ascii=False,
            separators=(",", ":"),
        )
        headers = {
            "Content-Type": "application/json",
            "Idempotency-Key": intent.idempotency_key,
            "Notifier-Intent-Digest": intent.intent_digest,
        }
        if self._signer is not None:
            now = datetime.now(UTC)
            headers["webhook-id"] = intent.idempotency_key
            headers["webhook-timestamp"] = str(int(now.timestamp()))
            headers["webhook-signature"] = self._signer.sign(intent.idempotency_key, now, body)
        try:
            response = self._client.post(self.url, content=body.encode("utf-8"), headers=headers)
        except (httpx2.ConnectError, httpx2.ConnectTimeout, httpx2.PoolTimeout) as exc:
            raise ChannelError(ErrorKind.NOT_SENT, f"{self.url}: cannot connect ({exc})") from exc
        except httpx2.TransportError as exc:
            # The request (or part of it) left: the receiver may have acted on it.
            raise ChannelError(
                ErrorKind.UNCERTAIN, f"{self.url}: {type(exc).__name__} after sending ({exc})"
            ) from exc
        _raise_for_status(self.url, response)
        return _receipt(response)

    def query(self, key: str) -> Receipt | None:
        if self.status_url is None:
            raise ChannelError(ErrorKind.UNCERTAIN, f"channel {self.name} has no status_url")
        url = self.status_url.replace("{key}", key)
        try:
            response = self._client.get(url, headers={"Accept": "application/json"})
        except httpx2.TransportError as exc:
            raise ChannelError(ErrorKind.UNCERTAIN, f"{url}: query failed ({exc})") from exc
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise ChannelError(
                ErrorKind.UNCERTAIN,
                f"{url}: query answered HTTP {response.status_code}",
                http_status=response.status_code,
            )
        return _receipt(response)

    def close(self) -> None:
        self._client.close()


def classify_status(status: int) -> ErrorKind | None:
    """An HTTP status as an error kind; None for success."""
    if 200 <= status < 300:
        return None
    if status in (429, 503):
        return ErrorKind.THROTTLED
    if status in (408, 500, 502, 504) or status >= 500:
        return ErrorKind.UNCERTAIN
    if status == 409:
        return ErrorKind.IN_PROGRESS
    if status == 422:
        return ErrorKind.CONFLICT
    if status == 410:
        return ErrorKind.GONE
    return ErrorKind.PERMANENT


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Retry-After as delay-seconds or an HTTP-date (RFC 9110 §10.2.3); None if absent or
    unreadable."""
    if value is None or not value.strip():
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def _signer(name: str, secret_env: str | None) -> Webhook | None:
    if not secret_env:
        return None
    secret = os.environ.get(secret_env)
    if not secret:
        raise ChannelConfigError(
            f"channel {name!r} signs with the secret in ${secret_env}, which is not set: "
            f"export {secret_env}=whsec_… before sending."
        )
    try:
        return Webhook(secret)
    except (binascii.Error, ValueError) as exc:
        raise ChannelConfigError(
            f"channel {name!r}: ${secret_env} is not a Standard Webhooks secret "
            "(whsec_ followed by base64)."
        ) from exc


def _raise_for_status(url: str, response: httpx2.Response) -> None:
    kind = classify_status(response.status_code)
    if kind is None:
        return
    snippet = response.text[:200].replace("\n", " ")
    raise ChannelError(
        kind,
        f"{url}: HTTP {response.status_code} {snippet}".rstrip(),
        http_status=response.status_code,
        retry_after=parse_retry_after(response.headers.get("Retry-After")),
    )


def _receipt(response: httpx2.Response) -> Receipt:
    """The receipt in a 2xx answer: its `id` and stored `intent_digest` when they are strings."""
    try:
        document = response.json()
    except ValueError:
        document = {}
    if not isinstance(document, dict):
        document = {}
    receipt_id = document.get("id")
    digest = document.get("intent_digest")
    return Receipt(
        receipt_id if isinstance(receipt_id, str) else None,
        digest if isinstance(digest, str) else None,
        replayed=response.headers.get("Idempotent-Replayed", "").lower() == "true",
    )
