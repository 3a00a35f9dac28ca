"""The webhook's transport against real misbehaving servers on 127.0.0.1: which error each
failure becomes, and so what the channel concludes. These classes are the durability
promise: only a request that provably never left may be NOT_SENT (and sent again blindly);
one that may have left is UNCERTAIN. Each attempt, connect to last body byte, ends at the
channel's `timeout` however the server paces its bytes."""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx2
import pytest

from notifier.channels import Withheld
from notifier.channels.deadline import DeadlineTransport, attempt_deadline
from notifier.channels.webhook import WebhookChannel
from notifier.domain.answers import ChannelError, ErrorKind
from notifier.domain.intent import Intent

TIMEOUT_S = 0.5
# A bound far above TIMEOUT_S, for a loaded machine, and far below what each server below
# would hold an attempt for without the per-attempt deadline (minutes, or forever).
WITHIN_S = 10.0

Behaviour = Callable[[socket.socket, threading.Event], None]


def read_request(conn: socket.socket) -> bytes:
    """The whole request (headers and a Content-Length body), so that it has provably left."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


class Server:
    """Accepts connections on 127.0.0.1 and runs `behaviour` on each, in its own thread."""

    def __init__(self, behaviour: Behaviour) -> None:
        self.stop = threading.Event()
        self.accepted = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._behaviour = behaviour
        self._connections: list[socket.socket] = []
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}/n"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed by close()
            self.accepted += 1
            self._connections.append(conn)
            threading.Thread(target=self._run, args=(conn,), daemon=True).start()

    def _run(self, conn: socket.socket) -> None:
        # The client gave up first (OSError): that is what most of these tests provoke.
        with contextlib.suppress(OSError):
            self._behaviour(conn, self.stop)

    def close(self) -> None:
        self.stop.set()
        self._listener.close()
        for conn in self._connections:
            conn.close()


@pytest.fixture
def serve() -> Iterator[Callable[[Behaviour], Server]]:
    servers: list[Server] = []

    def start(behaviour: Behaviour) -> Server:
        servers.append(Server(behaviour))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def intent(body: str = "Hallo") -> Intent:
    return Intent(
        run_id="run-1",
        seq=1,
        item_id="u1",
        channel="hooks",
        target="a@example.com",
        payload={"subject": "S", "body": body, "data": {}},
        idempotency_key="ntf1-abc",
        intent_digest="sha256:" + "0" * 64,
    )


def channel(url: str, **definition: Any) -> WebhookChannel:
    return WebhookChannel(
        "hooks", {"type": "webhook", "url": url, "timeout": TIMEOUT_S, **definition}
    )


def failure(url: str, body: str = "Hallo") -> tuple[ChannelError, float]:
    """The error one send to `url` ends in, and how long the attempt took."""
    hooks = channel(url)
    started = time.monotonic()
    try:
        with pytest.raises(ChannelError) as caught:
            hooks.send(intent(body))
    finally:
        hooks.close()
    return caught.value, time.monotonic() - started


def answer(status: int, body: bytes, *, length: int | None = None) -> bytes:
    head = f"HTTP/1.1 {status} X\r\nContent-Length: {len(body) if length is None else length}"
    return head.encode() + b"\r\nContent-Type: application/json\r\n\r\n" + body


# The servers' behaviours. Each paces itself on the stop event, so teardown ends it.


def stall(conn: socket.socket, stop: threading.Event) -> None:
    read_request(conn)
    stop.wait()


def hang_up(conn: socket.socket, stop: threading.Event) -> None:
    read_request(conn)
    conn.shutdown(socket.SHUT_RDWR)


def reset(conn: socket.socket, stop: threading.Event) -> None:
    read_request(conn)
    # SO_LINGER 0: close() sends a RST instead of a FIN.
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()


def trickle_status(conn: socket.socket, stop: threading.Event) -> None:
    read_request(conn)
    for byte in b"HTTP/1.1 201 Created\r\n" * 1000:
        if stop.wait(0.05):
            return
        conn.sendall(bytes([byte]))


def trickle_body(conn: socket.socket, stop: threading.Event) -> None:
    read_request(conn)
    conn.sendall(answer(200, b"", length=10_000))
    while not stop.wait(0.05):
        conn.sendall(b" ")


def truncate_body(conn: socket.socket, stop: threading.Event) -> None:
    read_request(conn)
    conn.sendall(answer(201, b'{"id":', length=100))
    conn.shutdown(socket.SHUT_RDWR)


def endless_body(conn: socket.socket, stop: threading.Event) -> None:
    read_request(conn)
    conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    chunk = b"x" * 65536
    while not stop.is_set():
        conn.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))


def never_read(conn: socket.socket, stop: threading.Event) -> None:
    stop.wait()


def receipt(conn: socket.socket, stop: threading.Event) -> None:
    while read_request(conn):  # keep-alive: answer every request on this connection
        conn.sendall(answer(201, json.dumps({"id": "dlv_1"}).encode()))


@pytest.fixture
def refusing() -> Iterator[str]:
    """A URL whose port is bound but not listening: connecting is refused (RST), and no other
    process can take the port while the test holds it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/n"


def test_a_refused_connection_is_not_sent_and_unreachable(refusing: str) -> None:
    """Connection refused: the request never left, so NOT_SENT, and the channel is down."""
    error, _ = failure(refusing)
    assert (error.kind, error.unreachable) == (ErrorKind.NOT_SENT, True)
    assert type(error.__cause__) is httpx2.ConnectError


def test_a_query_to_a_refused_connection_proves_nothing(refusing: str) -> None:
    """A status query that cannot connect is UNCERTAIN: it says nothing about the send."""
    hooks = channel("http://127.0.0.1:9/n", status_url=refusing + "/{key}")
    with pytest.raises(ChannelError) as caught:
        hooks.query("ntf1-abc")
    hooks.close()
    assert caught.value.kind is ErrorKind.UNCERTAIN
    assert type(caught.value.__cause__) is httpx2.ConnectError


@pytest.mark.parametrize(
    ("behaviour", "raised"),
    [
        (stall, httpx2.ReadTimeout),
        (hang_up, httpx2.RemoteProtocolError),
        (reset, httpx2.ReadError),
        (trickle_status, httpx2.ReadTimeout),
        (trickle_body, httpx2.ReadTimeout),
        (truncate_body, httpx2.RemoteProtocolError),
    ],
    ids=lambda value: getattr(value, "__name__", ""),
)
def test_a_failure_after_the_request_left_is_uncertain(
    serve: Callable[[Behaviour], Server], behaviour: Behaviour, raised: type[Exception]
) -> None:
    """No answer, a hang-up, a reset, or an answer trickled or cut short, after the whole
    request reached the server: UNCERTAIN (it may have acted), never NOT_SENT, and within the
    attempt's deadline however slowly the bytes come."""
    server = serve(behaviour)
    error, took = failure(server.url)
    assert (error.kind, error.unreachable) == (ErrorKind.UNCERTAIN, False)
    assert type(error.__cause__) is raised
    assert took < WITHIN_S
    assert server.accepted == 1


def test_a_request_the_server_never_reads_times_out_uncertain(
    serve: Callable[[Behaviour], Server],
) -> None:
    """A body the server never reads fills the socket buffers: the write times out at the
    deadline, UNCERTAIN (part of the request left)."""
    server = serve(never_read)
    error, took = failure(server.url, body="x" * (32 * 1024 * 1024))
    assert error.kind is ErrorKind.UNCERTAIN
    assert type(error.__cause__) is httpx2.WriteTimeout
    assert took < WITHIN_S


def test_an_endless_answer_is_read_up_to_the_cap_and_accepted(
    serve: Callable[[Behaviour], Server],
) -> None:
    """A 200 whose body never ends is accepted once webhook.MAX_BODY_BYTES have arrived (the rest
    is dropped), within the deadline."""
    server = serve(endless_body)
    hooks = channel(server.url)
    started = time.monotonic()
    try:
        assert hooks.send(intent()).receipt_id is None  # the cut body is no JSON receipt
    finally:
        hooks.close()
    assert time.monotonic() - started < WITHIN_S


def test_a_passed_deadline_stops_the_attempt_before_it_connects(
    serve: Callable[[Behaviour], Server],
) -> None:
    """Once the attempt's deadline has passed, no connection is even opened: a connect
    timeout, which the channel reads as NOT_SENT."""
    server = serve(receipt)
    limits = httpx2.Limits(max_connections=1)
    with httpx2.Client(transport=DeadlineTransport(limits, tls=False)) as client:
        with attempt_deadline(0), pytest.raises(httpx2.ConnectTimeout):
            client.get(server.url)
        assert client.get(server.url).status_code == 201  # the next attempt has its own
    assert server.accepted == 1


def test_waiting_for_a_free_connection_times_out_as_a_pool_timeout(
    serve: Callable[[Behaviour], Server],
) -> None:
    """With every connection busy, a request waits at most the pool timeout and fails as a
    PoolTimeout, before anything of it left (the channel reads it as NOT_SENT)."""
    server = serve(trickle_body)
    limits = httpx2.Limits(max_connections=1)
    timeout = httpx2.Timeout(5.0, pool=0.2)
    transport = DeadlineTransport(limits, tls=False)
    with httpx2.Client(transport=transport, timeout=timeout) as client:
        busy = client.send(client.build_request("GET", server.url), stream=True)
        try:
            with pytest.raises(httpx2.PoolTimeout):
                client.get(server.url)
        finally:
            busy.close()
    assert server.accepted == 1


def raised_through(transport: httpx2.BaseTransport, url: str, content: bytes) -> type[Exception]:
    """The class of the error one POST through `transport` ends in (timeouts: TIMEOUT_S)."""
    with (
        httpx2.Client(transport=transport, timeout=TIMEOUT_S) as client,
        pytest.raises(httpx2.HTTPError) as caught,
        client.stream("POST", url, content=content) as response,
    ):
        response.read()
    return type(caught.value)


@pytest.mark.parametrize(
    ("behaviour", "size"),
    [(stall, 1), (hang_up, 1), (reset, 1), (truncate_body, 1), (never_read, 32 * 1024 * 1024)],
    ids=lambda value: getattr(value, "__name__", str(value)),
)
def test_errors_are_those_httpx_own_transport_raises(
    serve: Callable[[Behaviour], Server], behaviour: Behaviour, size: int
) -> None:
    """Where a single network operation fails, the deadline transport raises the very httpx
    error that httpx's HTTPTransport raises for it (the channel classifies those)."""
    content = b"x" * size
    server = serve(behaviour)
    limits = httpx2.Limits(max_connections=1)
    ours = raised_through(DeadlineTransport(limits, tls=False), server.url, content)
    theirs = raised_through(httpx2.HTTPTransport(trust_env=False), server.url, content)
    assert ours is theirs


def test_a_refused_connection_is_the_error_httpx_own_transport_raises(refusing: str) -> None:
    """Connection refused: the same httpx error as HTTPTransport's (ConnectError)."""
    limits = httpx2.Limits(max_connections=1)
    ours = raised_through(DeadlineTransport(limits, tls=False), refusing, b"x")
    theirs = raised_through(httpx2.HTTPTransport(trust_env=False), refusing, b"x")
    assert ours is theirs is httpx2.ConnectError


def test_connections_are_kept_alive_between_attempts(
    serve: Callable[[Behaviour], Server],
) -> None:
    """Sends on one channel reuse the pooled connection: one accept for several requests."""
    server = serve(receipt)
    hooks = channel(server.url)
    try:
        for _ in range(3):
            assert hooks.send(intent()).receipt_id == "dlv_1"
    finally:
        hooks.close()
    assert server.accepted == 1


@pytest.fixture
def contexts(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every ssl.SSLContext built from now on, however it is built (ssl.create_default_
    context, httpcore's default context and httpx's all end in SSLContext.__new__)."""
    built: list[object] = []
    real = ssl.SSLContext.__new__

    def counting(cls: type[ssl.SSLContext], *args: Any, **kwargs: Any) -> ssl.SSLContext:
        context = real(cls, *args, **kwargs)
        built.append(context)
        return context

    monkeypatch.setattr(ssl.SSLContext, "__new__", counting)
    return built


@pytest.mark.parametrize(
    ("url", "status_url", "tls"),
    [
        ("http://127.0.0.1:9/n", "http://127.0.0.1:9/n/{key}", False),
        ("https://hooks.example/n", None, True),
        ("http://127.0.0.1:9/n", "HTTPS://status.example/{key}", True),
    ],
)
def test_a_tls_context_is_built_only_for_a_channel_that_may_need_it(
    contexts: list[object], url: str, status_url: str | None, tls: bool
) -> None:
    """Reading the CA bundle costs every start ~70 ms: a channel whose URLs are all plain
    http builds no TLS context at all; one https URL (send or query) builds one."""
    definition = {"type": "webhook", "url": url}
    if status_url is not None:
        definition["status_url"] = status_url
    WebhookChannel("hooks", definition).close()
    assert len(contexts) == (1 if tls else 0)


def test_a_plain_http_send_builds_no_tls_context(
    contexts: list[object], serve: Callable[[Behaviour], Server]
) -> None:
    """Nor does sending over plain http build one later, on the way to the server."""
    server = serve(receipt)
    hooks = channel(server.url)
    try:
        assert hooks.send(intent()).receipt_id == "dlv_1"
    finally:
        hooks.close()
    assert contexts == []


def test_the_senders_last_check_is_asked_once_connected_and_withholds_every_byte(
    serve: Callable[[Behaviour], Server],
) -> None:
    """The sender's last check (`ready`) is asked once the connection is made, before the
    request's first byte: on a new connection, and on a pooled one after a delivery. When
    it says no, the send raises Withheld with its reason and the server gets no byte."""
    requests: list[bytes] = []

    def answering(conn: socket.socket, stop: threading.Event) -> None:
        while request := read_request(conn):
            requests.append(request)
            conn.sendall(answer(201, json.dumps({"id": "dlv_1"}).encode()))

    server = serve(answering)
    hooks = channel(server.url)
    connected_when_asked: list[int] = []

    def closed() -> str | None:
        # Asked once connected: the server accepts the connection while the client waits
        # here (asked before connecting, it would wait in vain).
        deadline = time.monotonic() + WITHIN_S
        while server.accepted < len(connected_when_asked) + 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        connected_when_asked.append(server.accepted)
        return "its send window closed"

    try:
        with pytest.raises(Withheld) as withheld:
            hooks.send(intent(), closed)
        assert withheld.value.reason == "its send window closed"
        assert connected_when_asked == [1] and requests == []  # connected, nothing written
        assert hooks.send(intent()).receipt_id == "dlv_1"
        with pytest.raises(Withheld):
            hooks.send(intent(), closed)
    finally:
        hooks.close()
    assert connected_when_asked == [1, 2] and len(requests) == 1
