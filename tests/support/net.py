"""Ports on 127.0.0.1 for the servers a test starts, and for the ones it needs down."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listened on a moment ago, for a server the test
    starts on it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def refusing_port() -> Iterator[int]:
    """A TCP port on 127.0.0.1 that refuses every connection while the block runs: bound,
    never listening. A free_port() with nothing on it can be handed at once to another
    test's server binding port 0, which would then answer requests meant to find nobody."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]
