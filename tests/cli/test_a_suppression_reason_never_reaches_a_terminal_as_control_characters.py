"""A suppression's reason is shown to whoever runs `suppress list`: an escape sequence in it
(typed, pasted, or in an imported file someone else wrote) would act on that operator's
terminal (clear it, retitle it, hide the lines around it) rather than be shown. A reason
holding a control character is refused at `suppress add` and `suppress import` (exit 2,
nothing stored), and one stored before (written behind notifier's back here) is listed with
each control character shown as U+FFFD, never raw."""

from __future__ import annotations

import json

import pytest

from ..conftest import Workspace

pytestmark = [pytest.mark.timeout(60), pytest.mark.both_stores]


def _listed(ws: Workspace) -> list[str]:
    result = ws.invoke("suppress", "list", "--json")
    assert result.exit_code == 0, result.output
    return [s["address"] for s in json.loads(result.stdout)["suppressions"]]


ESCAPES = ["asked \x1b[2Jto stop", "asked to stop\x1b]0;owned\x07", "line\nbreak", "bell\x07"]


@pytest.mark.parametrize("reason", ESCAPES)
def test_suppress_add_refuses_a_reason_holding_a_control_character(
    ws: Workspace, reason: str
) -> None:
    assert ws.invoke("suppress", "add", "keep@example.com").exit_code == 0
    result = ws.invoke("suppress", "add", "bob@example.com", "--reason", reason)
    assert result.exit_code == 2, result.output
    assert "control character" in result.output and "Nothing was stored" in result.output
    assert "Traceback" not in result.output
    assert _listed(ws) == ["keep@example.com"]


@pytest.mark.parametrize("reason", ESCAPES)
def test_suppress_import_refuses_a_reason_holding_a_control_character(
    ws: Workspace, reason: str
) -> None:
    assert ws.invoke("suppress", "add", "keep@example.com").exit_code == 0
    quoted = reason.replace('"', '""')
    (ws.path / "bounced.csv").write_text(
        f'address,reason\nann@example.com,ok\nbob@example.com,"{quoted}"\n', encoding="utf-8"
    )
    result = ws.invoke("suppress", "import", "bounced.csv")
    assert result.exit_code == 2, result.output
    assert "line 3" in result.output and "control character" in result.output
    assert "nothing was stored" in result.output
    assert _listed(ws) == ["keep@example.com"]


def test_a_stored_reason_is_listed_without_its_control_characters(ws: Workspace) -> None:
    assert ws.invoke("suppress", "add", "bob@example.com", "--reason", "asked").exit_code == 0
    ws.write("UPDATE suppressions SET reason = ?", ("asked \x1b[2Jto stop",))
    result = ws.invoke("suppress", "list")
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.output
    assert "asked \ufffd[2Jto stop" in result.output
