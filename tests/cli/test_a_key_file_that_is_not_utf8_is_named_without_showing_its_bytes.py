"""An `[audit] key_file` whose bytes are not UTF-8 (a binary key, `head -c 32 /dev/urandom`)
is exit 2 naming the file, never quoting a byte of the key or where it sits, as for
NOTIFIER_AUDIT_KEY."""

from __future__ import annotations

import pytest

from ..conftest import Workspace

pytestmark = pytest.mark.timeout(60)


def test_the_refusal_shows_no_byte_of_the_key(ws: Workspace) -> None:
    (ws.path / "audit.key").write_bytes(b"\x01\x02\xfe\x41")
    (ws.path / "notifier.toml").write_text('[audit]\nkey_file = "audit.key"\n')
    result = ws.run("verify")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "audit.key" in result.stderr
    assert "0xfe" not in result.stderr and "position" not in result.stderr, result.stderr
