"""A plan removes the stages that killed plans left in the temp directory, found by the
pid in their name (`notifier-plan-<pid>-…`). A directory of that shape whose "pid" is not
ASCII digits (another program's, or another user's) is no stage of notifier's: the plan
leaves it alone and goes on, never an internal error."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from ..conftest import Workspace, make_rows

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("pid", ["\u00b2", "\u0661\u0662"])
def test_a_stray_directory_named_with_other_digits_is_left_alone(
    ws: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pid: str
) -> None:
    scratch = tmp_path / "scratch"
    stray = scratch / f"notifier-plan-{pid}-x"
    stray.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    (ws.path / "notifier.toml").write_text('[channels.files]\ntype = "outbox"\n')
    ws.write_csv("b.csv", make_rows(2))
    sent = ws.invoke("send", "b.csv", "--channel", "files")
    assert sent.exit_code == 0, sent.output
    assert len(ws.outbox_documents()) == 2
    assert list(scratch.iterdir()) == [stray]
