"""A command that does not send (`cancel`, `reconcile`, `approve`, `reject`) cut short by
Ctrl-C before it recorded what it was asked to do advises running it again, never `notifier
resume`: an operator cancelling a run who follows that would send it. A command that sends
(`resume`) still points to `resume`, which goes on from what was recorded."""

from __future__ import annotations

import pytest

from notifier.api import Notifier

from ..conftest import Workspace, make_rows
from ..support.crashed import crash_invoke

pytestmark = pytest.mark.timeout(60)
# Each test starts from a run killed after its first receipt: paused, one row left.


def _interrupted(*_: object, **__: object) -> None:
    raise KeyboardInterrupt


@pytest.mark.parametrize(
    ("method", "command"),
    [
        ("cancel", ("cancel",)),
        ("reconcile", ("reconcile",)),
        ("reject", ("reject", "--reason", "no")),
    ],
)
def test_ctrl_c_in_a_command_that_does_not_send_advises_it_again(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch, method: str, command: tuple[str, ...]
) -> None:
    (ws.path / "notifier.toml").write_text('[channels.files]\ntype = "outbox"\n')
    ws.write_csv("batch.csv", make_rows(2))
    crash_invoke(ws, "after-receipt:1", "send", "batch.csv", "--channel", "files")
    monkeypatch.setattr(Notifier, method, _interrupted)
    result = ws.invoke(*command)
    assert result.exit_code == 130, result.output
    assert "interrupted (Ctrl-C)" in result.output, result.output
    assert "resume" not in result.output, result.output
    assert "run the same command again" in result.output, result.output


def test_ctrl_c_in_resume_still_advises_resume(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    (ws.path / "notifier.toml").write_text('[channels.files]\ntype = "outbox"\n')
    ws.write_csv("batch.csv", make_rows(2))
    crash_invoke(ws, "after-receipt:1", "send", "batch.csv", "--channel", "files")
    monkeypatch.setattr(Notifier, "work", _interrupted)
    result = ws.invoke("resume")
    assert result.exit_code == 130, result.output
    assert "`notifier resume` continues it" in result.output, result.output
