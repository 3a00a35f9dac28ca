"""One deadline per HTTP attempt, covering connect, headers and body.

httpx's timeouts bound each network operation, so a server that answers one header byte a
second, or streams a body that never ends, keeps an attempt alive for as long as it likes.
This transport gives every read, write and connect only what is left of the attempt's
deadline (set by `attempt_deadline` around one request, per thread): once it has passed,
the next operation times out and the attempt ends as a timeout, which the channel classifies
as usual (uncertain once the request may have left).
"""

from __future__ import annotations

import ssl
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import httpcore2
import httpx2

_local = threading.local()


@contextmanager
def attempt_deadline(seconds: float) -> Iterator[None]:
    """Bound every network operation of the request made inside this block, in this thread,
    to `seconds` from now, all together."""
    _local.at = time.monotonic() + seconds
    try:
        yield
    finally:
        _local.at = None


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


class DeadlineTransport(httpx2.HTTPTransport):
    """httpx's own transport, with a connection pool whose sockets honour the deadline.

    `tls`: whether any request may go to an https URL. Building the TLS context (reading
    the CA bundle) cost every start of a plain-http channel ~70 ms of CPU for nothing."""

    def __init__(self, limits: httpx2.Limits, *, tls: bool = True) -> None:
        super().__init__(limits=limits, trust_env=False)
        self._pool = httpcore2.ConnectionPool(
            ssl_context=httpx2.create_ssl_context(trust_env=False) if tls else None,
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=_Backend(),
        )
