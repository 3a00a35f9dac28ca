"""`send --compose BRIEF` with a brief that is not UTF-8 text is bad input, as a template or
a batch file that is not is: exit 2 naming the file, nothing stored, nothing drafted, never
an internal error (exit 1)."""

from __future__ import annotations

import pytest

from ..conftest import Workspace
from ..fake_messages import FakeMessages
from .test_compose import batch

pytestmark = pytest.mark.timeout(60)


def test_a_brief_that_is_not_utf8_is_refused_naming_it(ws: Workspace, fake: FakeMessages) -> None:
    brief = ws.path / "brief.txt"
    brief.write_bytes("Tell them their plan renews. Sign it \u00e9quipe.".encode("latin-1"))
    result = ws.invoke("send", str(batch(ws, 2)), "--compose", str(brief))
    assert result.exit_code == 2, result.output
    assert "brief.txt" in result.output and "internal error" not in result.output
    assert fake.requests == [] and not ws.has_database()
