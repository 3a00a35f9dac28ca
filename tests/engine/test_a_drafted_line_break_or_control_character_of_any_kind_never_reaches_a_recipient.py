"""The content rules (docs/guarantees.md, "One set of content rules for every path"): a
subject is one printable line, a body carries no control character but tab and line
breaks, whatever wrote them. Unicode has line breaks and control characters beyond ASCII's:
NEL (U+0085) and the line and paragraph separators (U+2028, U+2029) end a line for Python's
own e-mail headers (`str.splitlines`), and the C1 controls (U+0080-U+009F) include CSI
(U+009B), the one-character form of ESC [ that a terminal acts on. A Claude draft's subject
is folded onto one line at them, as at a newline; a body carrying a C1 control fails its
row, as one with a NUL or an ESC does. Neither reaches the outbox as it came."""

from __future__ import annotations

from collections import deque

import pytest

from ..conftest import Workspace
from ..fake_messages import FakeMessages, tool_answer
from .test_compose import batch, brief

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    "subject",
    ["Hello\u2028Bcc: all@example.com", "Hello\u0085Bcc: all@example.com",
     "Hello\u2029Bcc: all@example.com"],
)  # fmt: skip
def test_a_drafted_subject_is_folded_at_a_unicode_line_break(
    ws: Workspace, fake: FakeMessages, subject: str
) -> None:
    fake.per_row["u1"] = deque([tool_answer(subject, "fine")])
    result = ws.invoke("send", str(batch(ws, 2)), "--compose", str(brief(ws)))
    assert result.exit_code == 0, result.output
    subjects = {d["item_id"]: d["subject"] for d in ws.outbox_documents()}
    assert subjects == {"u1": "Hello Bcc: all@example.com", "u2": "Draft u2"}


def test_a_drafted_body_with_a_c1_control_character_fails_its_row(
    ws: Workspace, fake: FakeMessages
) -> None:
    fake.per_row["u1"] = deque([tool_answer("Hello", "an \u009b31mCSI\u009b0m")])
    result = ws.invoke("send", str(batch(ws, 2)), "--compose", str(brief(ws)))
    assert result.exit_code == 3, result.output
    assert "body contains a control character (U+009B)" in result.output
    assert [d["item_id"] for d in ws.outbox_documents()] == ["u2"]
