"""A batch file whose name holds bytes that are not UTF-8 (a file copied from an older
system, `b\\xff.csv`) is read and sent like any other: the run stores its name as it can be
shown (the bytes escaped), never an internal error. Both stores (the name is a column)."""

from __future__ import annotations

import json
import os

import pytest

from ..conftest import Workspace, make_rows

pytestmark = [pytest.mark.timeout(30), pytest.mark.both_stores]


def test_a_batch_file_named_in_bytes_that_are_not_utf8_is_sent(ws: Workspace) -> None:
    (ws.path / "notifier.toml").write_text('[channels.files]\ntype = "outbox"\n')
    written = ws.write_csv("rows.csv", make_rows(2))
    name = os.fsdecode(b"b\xff.csv")  # as the shell hands it over: surrogate-escaped
    os.rename(written, ws.path / name)
    sent = ws.invoke("send", name, "--channel", "files")
    assert sent.exit_code == 0, sent.output
    assert len(ws.outbox_documents()) == 2
    report = json.loads(ws.invoke("report", "--format", "json").output)
    assert report["batch"] == "b\\xff.csv", report["batch"]
