"""The webhook's HTTP transport: one deadline per attempt, covering connect, headers and body.

httpx's timeouts bound each network operation, so a server that answers one header byte a
second, or streams a body that never ends, keeps an attempt alive for as long as it likes.
This transport gives every read, write and connect only what is left of the attempt's
deadline (set by `attempt_deadline` around one request, per thread): once it has passed,
the next operation times out and the attempt ends as a timeout, which the channel classifies
as usual (uncertain once the request may have left). The sender's last check (`ready`,
channels/base.py) is asked there too, before the request's first byte is written: after the
connection, new or pooled, and its TLS are ready.

It is a transport of its own, like httpx's HTTPTransport: `handle_request` (the public
BaseTransport API) over an httpcore connection pool built here, with the deadline-aware
network backend below, and httpcore's errors turned into the httpx errors HTTPTransport
raises, which is what the channel classifies.
"""

from __future__ import annotations

import ssl
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import httpcore2
import httpx2

from notifier.channels.base import Ready, go_ahead

_local = threading.local()


@contextmanager
def attempt_deadline(seconds: float, ready: Ready | None = None) -> Iterator[None]:
    """Bound every network operation of the request made inside this block, in this thread,
    to `seconds` from now, all together; ask `ready` before its first byte is written."""
    _local.at = time.monotonic() + seconds
    _local.ready = ready
    try:
        yield
    finally:
        _local.at = None
        _local.ready = None


def _last_check() -> None:
    """The sender's last check, once per request, right before its first byte leaves:
    Withheld (raised through httpcore unchanged) when the request must not go."""
    ready: Ready | None = getattr(_local, "ready", None)
    if ready is not None:
        _local.ready = None
        go_ahead(ready)


def _left(timeout: float | None, expired: type[Exception]) -> float | None:
    at: float | None = getattr(_local, "at", None)
    if at is None:
        return timeout
    left = at - time.monotonic()
    if left <= 0:
        raise expired("the attempt's deadline has passed")
    return left if timeout is None else min(timeout, left)


class _Stream(httpcore2.NetworkStream):
    def __init__(self, inner: httpcore2.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _left(timeout, httpcore2.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        _last_check()
        self._inner.write(buffer, _left(timeout, httpcore2.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore2.NetworkStream:
        inner = self._inner.start_tls(
            ssl_context, server_hostname, _left(timeout, httpcore2.ConnectTimeout)
        )
        return _Stream(inner)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _Backend(httpcore2.NetworkBackend):
    def __init__(self) -> None:
        self._inner = httpcore2.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.NetworkStream:
        left = _left(timeout, httpcore2.ConnectTimeout)
        return _Stream(self._inner.connect_tcp(host, port, left, local_address, socket_options))

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.NetworkStream:
        left = _left(timeout, httpcore2.ConnectTimeout)
        return _Stream(self._inner.connect_unix_socket(path, left, socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


# httpcore's errors as the httpx ones HTTPTransport raises for them (httpx2's private
# map_httpcore_exceptions), so that the channel's classification is the same: connect and
# pool errors mean nothing left (NOT_SENT), the others that the request may have (UNCERTAIN).
_ERRORS: dict[type[Exception], type[httpx2.TransportError]] = {
    httpcore2.TimeoutException: httpx2.TimeoutException,
    httpcore2.ConnectTimeout: httpx2.ConnectTimeout,
    httpcore2.ReadTimeout: httpx2.ReadTimeout,
    httpcore2.WriteTimeout: httpx2.WriteTimeout,
    httpcore2.PoolTimeout: httpx2.PoolTimeout,
    httpcore2.NetworkError: httpx2.NetworkError,
    httpcore2.ConnectError: httpx2.ConnectError,
    httpcore2.ReadError: httpx2.ReadError,
    httpcore2.WriteError: httpx2.WriteError,
    httpcore2.ProxyError: httpx2.ProxyError,
    httpcore2.UnsupportedProtocol: httpx2.UnsupportedProtocol,
    httpcore2.ProtocolError: httpx2.ProtocolError,
    httpcore2.LocalProtocolError: httpx2.LocalProtocolError,
    httpcore2.RemoteProtocolError: httpx2.RemoteProtocolError,
}


def _reraise(exc: Exception) -> NoReturn:
    """Raise the httpx error for httpcore's `exc`: that of its most specific class (the
    first of its MRO in _ERRORS), with the same message; anything else unchanged."""
    for cls in type(exc).__mro__:
        mapped = _ERRORS.get(cls)
        if mapped is not None:
            raise mapped(str(exc)) from exc
    raise exc


class _Body(httpx2.SyncByteStream):
    """An answer's body as httpcore streams it, its errors turned into httpx's."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = chunks

    def __iter__(self) -> Iterator[bytes]:
        try:
            yield from self._chunks
        except Exception as exc:
            _reraise(exc)

    def close(self) -> None:
        close = getattr(self._chunks, "close", None)
        if close is not None:
            close()  # back to the pool, or closed if not read to the end


class DeadlineTransport(httpx2.BaseTransport):
    """HTTP/1.1 over a connection pool whose sockets honour the attempt's deadline.

    `tls`: whether any request may go to an https URL. Building the TLS context (reading
    the CA bundle) cost every start of a plain-http channel ~70 ms of CPU for nothing. Never
    a proxy from the environment: the URL is exactly where the run's snapshot says."""

    def __init__(self, limits: httpx2.Limits, *, tls: bool = True) -> None:
        self._pool = httpcore2.ConnectionPool(
            ssl_context=httpx2.create_ssl_context(trust_env=False) if tls else None,
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=_Backend(),
        )

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        assert isinstance(request.stream, httpx2.SyncByteStream)  # a sync Client's request
        outgoing = httpcore2.Request(
            method=request.method,
            url=httpcore2.URL(
                scheme=request.url.raw_scheme,
                host=request.url.raw_host,
                port=request.url.port,
                target=request.url.raw_path,
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,  # the Client's timeouts travel here
        )
        try:
            answer = self._pool.handle_request(outgoing)
        except Exception as exc:
            _reraise(exc)
        assert isinstance(answer.stream, Iterable)  # a sync pool's answer
        return httpx2.Response(
            status_code=answer.status,
            headers=answer.headers,
            stream=_Body(answer.stream),
            extensions=answer.extensions,
        )

    def close(self) -> None:
        self._pool.close()
