"""`send --compose --dry-run` drafts the first rows to show them, storing nothing. A row the
API gives no draft for (overloaded through every retry), or whose draft the run's template
cannot render by the content rules, is shown as such, like a malformed answer is: the dry
run never ends in an internal error (exit 1)."""

from __future__ import annotations

from collections import deque

import pytest

from ..conftest import Workspace
from ..fake_messages import FakeMessages, error, tool_answer
from .test_compose import batch, brief

pytestmark = pytest.mark.timeout(60)


def test_a_row_the_api_stays_overloaded_for_is_shown_as_not_drafted(
    ws: Workspace, fake: FakeMessages, fast_waits: float
) -> None:
    fake.per_row["u1"] = deque(error(529, "overloaded_error", "Overloaded") for _ in range(5))
    result = ws.invoke("send", str(batch(ws, 2)), "--compose", str(brief(ws)), "--dry-run")
    assert result.exit_code in (0, 3), result.output
    assert "Draft u2" in result.output
    assert not ws.has_database()


def test_a_draft_the_template_cannot_render_is_shown_as_failed(
    ws: Workspace, fake: FakeMessages
) -> None:
    """The template puts the draft's body in the subject: a two-line body breaks the
    subject's one-line rule, so that row's draft fails; the other is shown."""
    template = ws.path / "tpl.toml"
    template.write_text("subject = '{{ draft.body }}'\nbody = '{{ draft.subject }}'\n", "utf-8")
    fake.per_row["u1"] = deque([tool_answer("One", "line one\nline two")])
    result = ws.invoke(
        "send", str(batch(ws, 2)), "--compose", str(brief(ws)), "--template", str(template),
        "--dry-run",
    )  # fmt: skip
    assert result.exit_code in (0, 3), result.output
    assert "Dear User 2, hello." in result.output
    assert not ws.has_database()
