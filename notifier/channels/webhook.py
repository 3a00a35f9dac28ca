"""HTTP webhooks over httpx2 (the client the anthropic SDK brings).

The idempotency key travels as `Idempotency-Key` and as the Standard Webhooks `webhook-id`
(the same on every retry, as the spec asks); the intent digest as `Notifier-Intent-Digest`,
so a careful receiver can refuse a different payload under a known key. With `status_url`
the channel is queryable: GET it → 200 found, 404 not found, anything else uncertain.

A URL that holds a credential comes from the environment (`url_env`, `status_url_env`): the
run's snapshot keeps the variable's name, and errors name the URL by it, never by its value.
"""

from __future__ import annotations

import base64
import email.utils
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote, unquote_plus, urlsplit

import httpx2
from standardwebhooks import Webhook

from notifier import __version__
from notifier.channels import options as o
from notifier.channels.base import ChannelConfigError, Ready, always
from notifier.channels.deadline import DeadlineTransport, attempt_deadline
from notifier.channels.webhook_options import SCHEMA, capabilities, status_url_problem
from notifier.domain.answers import ChannelError, ErrorKind, Receipt, bounded_wait
from notifier.domain.intent import Intent
from notifier.domain.redact import literal, masked, masks

# The most of an answer's body that is read; the rest is dropped. A receipt is a small JSON
# document: a server streaming megabytes (or forever) must not fill memory or hold the run.
MAX_BODY_BYTES = 1024 * 1024


class WebhookChannel:
    def __init__(
        self,
        name: str,
        definition: dict[str, Any],
        transport: httpx2.BaseTransport | None = None,
    ) -> None:
        self.name = name
        problems = SCHEMA.problems(f"channel {name!r} (webhook)", definition)
        if problems:
            raise ChannelConfigError("; ".join(problems))
        self.url, self._url_label = _target(name, definition, "url", o.http_url)
        status = _target(name, definition, "status_url", status_url_problem)
        self.status_url: str | None = status[0] or None
        self._status_label = status[1]
        self.idempotent, self.queryable, self.thread_safe = capabilities(definition)
        secret_env = definition.get("secret_env")
        secret = os.environ.get(secret_env) if secret_env else None
        self._signer = _signer(name, secret_env, secret)
        # What must never be quoted into a stored error, whoever says it (a receiver's
        # answer, the HTTP library): the secret, its key without the `whsec_` prefix, and
        # a URL from the environment with the parts of it that could be its secret.
        targets = ((self.url, self._url_label), status)
        from_env = [url for url, label in targets if url != label]
        self._masks = masks(
            [
                *((secret, secret.removeprefix("whsec_")) if secret else ()),
                *(part for url in from_env for part in _url_secrets(url)),
            ]
        )
        self.timeout = float(SCHEMA.value(definition, "timeout"))
        self.timeout_s = self.timeout
        self.query_delay_s = float(SCHEMA.value(definition, "query_delay"))
        self.suppress_on_reject = False  # no relay to reject a recipient
        self.max_in_flight: int | None = None  # as many as the run's senders
        # One keep-alive connection per concurrent sender is plenty.
        limits = httpx2.Limits(max_connections=64, max_keepalive_connections=64)
        self._client = httpx2.Client(
            timeout=httpx2.Timeout(self.timeout),
            limits=limits,
            # Never route through a proxy from the environment: the URL is exactly where the
            # run's snapshot says the notifications go.
            trust_env=False,
            follow_redirects=False,
            # The deadline transport bounds each attempt as a whole (timeout = the attempt).
            transport=transport or DeadlineTransport(limits, tls=self._tls()),
            headers={"User-Agent": f"notifier/{__version__}"},
        )

    def _tls(self) -> bool:
        """Whether a request of this channel may need TLS (redirects are never followed)."""
        return any(
            url is not None and not url.lower().startswith("http://")
            for url in (self.url, self.status_url)
        )

    def send(self, intent: Intent, ready: Ready = always) -> Receipt:
        document: dict[str, Any] = {
            "to": intent.target,
            "subject": intent.subject,
            "body": intent.body,
            "data": dict(intent.data),
            "run_id": intent.run_id,
            "item_id": intent.item_id,
        }
        # Only when the row has them: every other body stays byte for byte as it was.
        if intent.unsubscribe_url is not None:
            document["unsubscribe_url"] = intent.unsubscribe_url
        if intent.unsubscribe_mailto is not None:
            document["unsubscribe_mailto"] = intent.unsubscribe_mailto
        body = json.dumps(document, ensure_ascii=False, separators=(",", ":"))
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
            request = self._client.build_request(
                "POST", self.url, content=body.encode("utf-8"), headers=headers
            )
            answer = self._exchange(request, ready)
        except (httpx2.InvalidURL, UnicodeError) as exc:
            # The URL (or its host name) cannot even be put on the wire: nothing left.
            raise ChannelError(
                ErrorKind.NOT_SENT,
                f"{self._url_label}: unusable URL ({self._said(exc)})",
                unreachable=True,
            ) from exc
        except (
            httpx2.ConnectError,
            httpx2.ConnectTimeout,
            httpx2.PoolTimeout,
            httpx2.UnsupportedProtocol,
        ) as exc:
            raise ChannelError(
                ErrorKind.NOT_SENT,
                f"{self._url_label}: cannot connect ({self._said(exc)})",
                unreachable=True,
            ) from exc
        except (httpx2.HTTPError, httpx2.StreamError) as exc:
            # The request (or part of it) left: the receiver may have acted on it. This
            # includes an answer that cannot be read (httpx2.DecodingError, a broken
            # Content-Encoding, is not a TransportError) or that did not arrive whole
            # within the attempt's deadline: an unreadable answer proves nothing.
            raise ChannelError(
                ErrorKind.UNCERTAIN,
                f"{self._url_label}: {type(exc).__name__} after sending "
                f"({self._said(exc) or 'no detail'})",
            ) from exc
        _raise_for_status(self._url_label, answer, self._masks)
        return _receipt(answer, self._masks)

    def _said(self, exc: Exception) -> str:
        """What an exception says, without any secret of the channel."""
        return masked(str(exc), self._masks)

    def _exchange(self, request: httpx2.Request, ready: Ready | None = None) -> _Answer:
        """One request under one deadline: status, headers and at most MAX_BODY_BYTES of the
        body (the rest is dropped). An answer that cannot be read whole within the deadline
        raises, whatever its status: an unreadable answer proves nothing. `ready` is asked
        once the connection is ready, before the request's first byte (deadline.py)."""
        with attempt_deadline(self.timeout, ready):
            response = self._client.send(request, stream=True)
            try:
                body = bytearray()
                for chunk in response.iter_bytes():
                    body += chunk[: MAX_BODY_BYTES - len(body)]
                    if len(body) >= MAX_BODY_BYTES:
                        break
            finally:
                response.close()
        return _Answer(response.status_code, response.headers, bytes(body))

    def query(self, key: str) -> Receipt | None:
        if self.status_url is None:
            raise ChannelError(ErrorKind.UNCERTAIN, f"channel {self.name} has no status_url")
        request = self._client.build_request(
            "GET", self.status_url.replace("{key}", key), headers={"Accept": "application/json"}
        )
        # How errors name the URL: as written in notifier.toml, or by its variable.
        url = self._status_label.replace("{key}", key)
        try:
            answer = self._exchange(request)
        except (httpx2.HTTPError, httpx2.StreamError) as exc:
            # Unreachable, stalled, or an answer that cannot be decoded: nothing is proven.
            raise ChannelError(
                ErrorKind.UNCERTAIN,
                f"{url}: query failed ({type(exc).__name__}: {self._said(exc)})",
            ) from exc
        if answer.status == 404:
            return None
        if classify_status(answer.status) is ErrorKind.THROTTLED:
            # The receiver asks to be left alone, its status endpoint as much as its inbox:
            # the asker closes the channel's gate, so sends wait as well.
            raise ChannelError(
                ErrorKind.THROTTLED,
                f"{url}: query answered HTTP {answer.status}",
                http_status=answer.status,
                retry_after=parse_retry_after(answer.headers.get("Retry-After")),
            )
        if answer.status != 200:
            raise ChannelError(
                ErrorKind.UNCERTAIN,
                f"{url}: query answered HTTP {answer.status}",
                http_status=answer.status,
            )
        if _document(answer.body) is None:
            # Found only by a receipt, "200 JSON": a 200 page that is none (a login page, a
            # catch-all route, an empty body) is not the receiver's answer about the key.
            raise ChannelError(
                ErrorKind.UNCERTAIN,
                f"{url}: query answered HTTP 200 without a JSON receipt",
                http_status=answer.status,
            )
        return _receipt(answer, self._masks)

    def close(self) -> None:
        self._client.close()


def classify_status(status: int) -> ErrorKind | None:
    """An HTTP status as an error kind; None for success."""
    if 200 <= status < 300:
        return None
    if status in (429, 503):
        return ErrorKind.THROTTLED
    # A 3xx is not followed, and may answer a request that was processed (303 See Other
    # says so: RFC 9110 15.4.4), like a 1xx never finished: neither proves anything.
    if status in (408, 500, 502, 504) or status >= 500 or status < 200 or 300 <= status < 400:
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
    unreadable; bounded to MAX_RETRY_AFTER_S, however large the value."""
    if value is None or not value.strip():
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():  # delay-seconds: ASCII digits (RFC 9110)
        return bounded_wait(float(value))
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return bounded_wait((when - (now or datetime.now(UTC))).total_seconds())


def _signer(name: str, secret_env: str | None, secret: str | None) -> Webhook | None:
    """The signer for `secret`, read from `secret_env` (None: the channel does not sign)."""
    if not secret_env:
        return None
    if not secret:
        raise ChannelConfigError(
            f"channel {name!r} signs with the secret in ${secret_env}, which is not set: "
            f"export {secret_env}=whsec_… before sending."
        )
    try:
        # Strictly: the library decodes leniently (skipping stray characters), so a mistyped
        # secret would sign with other bytes than the receiver's, and an empty one raised late.
        encoded = secret.removeprefix("whsec_")
        if not base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True):
            raise ValueError("empty")
        return Webhook(secret)
    except Exception:  # never echo it: the message would quote the secret
        raise ChannelConfigError(
            f"channel {name!r}: ${secret_env} is not a Standard Webhooks secret "
            "(whsec_ followed by base64); set it to the signing secret the receiver issued."
        ) from None


def _target(
    name: str, definition: dict[str, Any], key: str, problem: Callable[[str], str | None]
) -> tuple[str, str]:
    """The URL of `key` (`url`, `status_url`) and how errors name it: as notifier.toml
    writes it (the schema refused one carrying a credential), or, from the environment
    variable `{key}_env` names, by that variable and its scheme alone, never its value
    (a URL kept there is one whose path or query is a secret). ('', '') when unset."""
    if key in definition:
        return str(definition[key]), str(definition[key])
    variable = definition.get(f"{key}_env")
    if variable is None:
        return "", ""
    where = f"channel {name!r} (webhook)"
    url = os.environ.get(variable, "").strip()
    if not url:
        raise ChannelConfigError(
            f"{where}: environment variable {variable} (named by `{key}_env`) is not set or "
            f"empty; export {variable} with the receiver's whole URL before sending."
        )
    control = o.url_control(url)
    if control is not None:
        raise ChannelConfigError(
            f"{where}: ${variable} (named by `{key}_env`) {control} (its value is not shown); "
            "set it to the receiver's whole URL on one line."
        )
    if problem(url) is not None:
        # The problem's wording may quote the URL's host or more: never shown.
        wanted = " and {key} where the key goes" if key == "status_url" else ""
        raise ChannelConfigError(
            f"{where}: ${variable} (named by `{key}_env`) is not an http:// or https:// URL "
            f"with a host{wanted}; set it to the receiver's whole URL (its value is not shown)."
        )
    scheme = url.partition("://")[0].lower()
    label = f"${variable} ({scheme}://…)"
    return url, label + " with {key}" if key == "status_url" else label


# The shortest part of a URL from the environment masked on its own (its user part, its
# password, its path and query): shorter ones could not be told from ordinary words.
_MIN_SECRET_PART = 6
# The shortest value of a parameter named like a credential (`token=`, `key=`, `sig=`)
# masked: its name says what it is, whatever it looks like (letters alone, digits alone,
# short); shorter ones would mask pieces of ordinary text.
_MIN_CREDENTIAL = 4


def _token_like(piece: str) -> bool:
    """Whether a path segment or query value could be a token: long, or of letters and
    digits both. `notify`, `incoming` or `alerts` are words a receiver's message and its
    receipt ids use, masked out of them they would read wrong."""
    if len(piece) >= 16:
        return True
    return len(piece) >= 8 and any(c.isdigit() for c in piece) and any(c.isalpha() for c in piece)


def _url_secrets(url: str) -> list[str]:
    """A URL from the environment and the parts of it that could be its secret, as a
    receiver or the HTTP library could quote them: its user part and password, a host name
    holding a token, its path and query, and each path segment and query value; a status
    URL's parts around `{key}`."""
    parts: list[str] = [url]
    for piece in url.split("{key}"):
        try:
            split = urlsplit(piece)
            password = split.password or ""
        except ValueError:
            split, password = urlsplit(""), ""
        tail = split.path + (f"?{split.query}" if split.query else "")
        userinfo = split.netloc.rpartition("@")[0]
        parts += [piece, userinfo, password, tail, split.query]
        # A host name holding a token (a per-endpoint subdomain): the token, and the host
        # (as `Host` or a library's error quotes it); `hooks.slack.com` holds none.
        host = split.hostname or ""
        labels = [label for label in host.split(".") if _token_like(label)]
        parts += [*labels, host] if labels else []
        pieces = re.split(r"[/?&;=]", tail)
        # As a receiver shows them: decoded (a framework's parsed query), and the user part
        # as the Basic credentials it was sent as.
        words = [w for piece in pieces for w in (piece, unquote_plus(piece)) if _token_like(w)]
        parts += [*words, unquote(userinfo)]
        if userinfo:
            parts.append(base64.b64encode(unquote(userinfo).encode()).decode())
    return [part for part in parts if len(part) >= _MIN_SECRET_PART] + _credential_values(url)


def _credential_values(url: str) -> list[str]:
    """The values of the parameters of `url` named like a credential (options.
    query_credential, what a URL in notifier.toml is refused for), as written and decoded,
    whatever their shape: `_token_like` would read `?token=QxZpLmNoRtYw` as a word."""
    values = []
    for field in re.split(r"[/?&;#]", url.replace("{key}", "/")):
        value = field.partition("=")[2]
        if value and o.query_credential(field) is not None:
            values += [value, unquote_plus(value)]
    return [value for value in values if len(value) >= _MIN_CREDENTIAL]


@dataclass(frozen=True)
class _Answer:
    status: int
    headers: httpx2.Headers
    body: bytes


def _raise_for_status(url: str, answer: _Answer, hidden: tuple[str, ...]) -> None:
    kind = classify_status(answer.status)
    if kind is None:
        return
    # Masked before it is cut: a secret across the cut would leave its first part behind.
    body = masked(answer.body.decode("utf-8", "replace"), hidden)
    snippet = literal(body[:200].replace("\n", " "))
    raise ChannelError(
        kind,
        f"{url}: HTTP {answer.status} {snippet}".rstrip(),
        http_status=answer.status,
        retry_after=parse_retry_after(answer.headers.get("Retry-After")),
    )


def _document(body: bytes) -> dict[str, Any] | None:
    """An answer's body as a JSON object, or None when it is not one."""
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):  # not JSON, or nested deeper than the parser goes
        return None
    return document if isinstance(document, dict) else None


# The most of a receipt's `intent_digest` kept: ours is `sha256:` and 64 hex digits, so one
# longer is another intent's (a conflict) however it ends, and is quoted as an extract.
_DIGEST_CHARS = 200


def _said_digest(digest: str, hidden: tuple[str, ...]) -> str:
    """The digest a receipt names, as a conflict quotes it: masked (before it is cut, as an
    error's extract is) and at most _DIGEST_CHARS long."""
    said = literal(masked(digest, hidden))
    return said if len(said) <= _DIGEST_CHARS else said[:_DIGEST_CHARS] + "…"


def _receipt(answer: _Answer, hidden: tuple[str, ...]) -> Receipt:
    """The receipt in a 2xx answer: its `id` (a secret of the channel it quotes masked, as in
    an error) and stored `intent_digest`, when they are strings."""
    document = _document(answer.body) or {}
    receipt_id = document.get("id")
    digest = document.get("intent_digest")
    return Receipt(
        literal(masked(receipt_id, hidden)) if isinstance(receipt_id, str) else None,
        _said_digest(digest, hidden) if isinstance(digest, str) else None,
        replayed=answer.headers.get("Idempotent-Replayed", "").lower() == "true",
    )
