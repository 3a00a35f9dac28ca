"""The PostgreSQL password comes from the environment (PGPASSWORD) and is never printed,
also where the server quotes it back: a server (or a proxy in front of it) that asks for
the password in clear and refuses it quoting what it got has its refusal shown with the
password masked, in the plain message and in the JSON error of `--log-format json`."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import pytest
from click.testing import CliRunner

from notifier.cli import cli

pytestmark = pytest.mark.timeout(60)
PASSWORD = "PgSeCrEt4242"

_SSL_OR_GSS_REQUEST = (80877103, 80877104)  # answered "N": no encryption
_CLEARTEXT_PASSWORD = 3  # AuthenticationCleartextPassword


def _read(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def _message(conn: socket.socket) -> bytes:
    """One length-prefixed message (the startup packet's form: no type byte)."""
    (length,) = struct.unpack("!I", _read(conn, 4))
    return _read(conn, length - 4)


def _refuse_quoting_the_password(conn: socket.socket) -> None:
    with conn, suppress(EOFError, OSError):
        while struct.unpack("!I", _message(conn)[:4])[0] in _SSL_OR_GSS_REQUEST:
            conn.sendall(b"N")
        conn.sendall(b"R" + struct.pack("!II", 8, _CLEARTEXT_PASSWORD))
        _read(conn, 1)  # 'p', the password message
        got = _message(conn).rstrip(b"\0")
        fields = b'SFATAL\0VFATAL\0C28P01\0Mpassword authentication failed: got "%s"\0\0' % got
        conn.sendall(b"E" + struct.pack("!I", len(fields) + 4) + fields)


@contextmanager
def echoing_server() -> Iterator[int]:
    """A PostgreSQL server on 127.0.0.1 that asks each client for its password in clear and
    refuses it, quoting the password it was sent. Its port."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        with suppress(OSError):
            while True:
                conn, _ = listener.accept()
                threading.Thread(
                    target=_refuse_quoting_the_password, args=(conn,), daemon=True
                ).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["status"], id="status"),
        pytest.param(["status", "--json"], id="status-json"),
        pytest.param(["resume", "--log-format", "json"], id="resume-json-log"),
        pytest.param(["verify"], id="verify"),
    ],
)
def test_a_password_the_server_quotes_back_is_masked(args: list[str]) -> None:
    with echoing_server() as port:
        result = CliRunner().invoke(
            cli,
            ["--db", f"postgresql://alice@127.0.0.1:{port}/notifier", *args],
            env={"PGPASSWORD": PASSWORD, "PGSSLMODE": "disable", "PGGSSENCMODE": "disable"},
        )
    assert result.exit_code not in (0, 1), result.output
    assert "password authentication failed" in result.output, result.output
    assert PASSWORD not in result.output, result.output
