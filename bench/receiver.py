"""A fast stand-in receiver for the benchmarks: one asyncio thread, HTTP/1.1 keep-alive,
a fixed 201 answer with a receipt, no JSON parsing, no fault injection.

The sandbox (`notifier sandbox`) is a careful provider: a thread per connection, the JSON
body parsed and checked, every delivery stored under a lock. On the benchmark's 2-core
machine it costs more CPU per request than the client that calls it, so at 0 ms it is the
bottleneck: both the plain loop and notifier wait for it, and their items/s ratio is pressed
towards 1. This receiver spends a small fraction of that per request, so the client's own
CPU per item decides its items/s, as it does when the receiver runs on another machine.

It answers `POST /notifications` with 201 and `{"id": ..., "intent_digest": ...}` (the
digest echoed from the `Notifier-Intent-Digest` header, as a careful receiver stores it),
`GET /notifications/{key}` with 200 and that receipt or 404, after --latency-ms when set.

    python bench/receiver.py [--latency-ms 0]   # prints "listening on http://127.0.0.1:PORT/notifications"
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json

_CREATED = b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: "
_OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
_MISSING = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"


class _Connection(asyncio.Protocol):
    def __init__(self, receipts: dict[bytes, bytes], latency_s: float) -> None:
        self.receipts = receipts
        self.latency_s = latency_s
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            head = self.buffer[:end]
            length = 0
            headers: dict[bytes, bytes] = {}
            lines = head.split(b"\r\n")
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                headers[name.strip().lower()] = value.strip()
            length = int(headers.get(b"content-length", b"0"))
            if len(self.buffer) < end + 4 + length:
                return  # the body is not all here yet
            self.buffer = self.buffer[end + 4 + length :]
            self._answer(lines[0].split(b" "), headers)

    def _answer(self, request_line: list[bytes], headers: dict[bytes, bytes]) -> None:
        method, path = request_line[0], request_line[1]
        if method == b"POST":
            key = headers.get(b"idempotency-key", b"")
            receipt = self.receipts.get(key)
            if receipt is None:
                digest = headers.get(b"notifier-intent-digest", b"").decode()
                document = {"id": f"r{len(self.receipts) + 1}", "intent_digest": digest}
                receipt = json.dumps(document).encode()
                self.receipts[key] = receipt
            reply = _CREATED + str(len(receipt)).encode() + b"\r\n\r\n" + receipt
        else:
            receipt = self.receipts.get(path.rsplit(b"/", 1)[-1])
            reply = (
                _MISSING
                if receipt is None
                else _OK + str(len(receipt)).encode() + b"\r\n\r\n" + receipt
            )
        assert self.transport is not None
        if self.latency_s > 0:
            asyncio.get_running_loop().call_later(self.latency_s, self._write, reply)
        else:
            self.transport.write(reply)

    def _write(self, reply: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(reply)


async def serve(latency_ms: float) -> None:
    receipts: dict[bytes, bytes] = {}
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: _Connection(receipts, latency_ms / 1000), "127.0.0.1", 0, backlog=128
    )
    port = server.sockets[0].getsockname()[1]
    print(f"listening on http://127.0.0.1:{port}/notifications", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--latency-ms", type=float, default=0)
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.latency_ms))


if __name__ == "__main__":
    main()
