"""An audit file exported before files held the run's channel snapshot (format
notifier-audit-1, a committed fixture) is read as written: verified with the key it is keyed
and whole, and an edit in it is still named, by its seal and by the replay."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from notifier.api import Notifier

from ..support.audited import config, keyed

pytestmark = pytest.mark.timeout(60)
FIXTURE = Path(__file__).parent.parent / "fixtures" / "audit-1-keyed.db"


def test_a_file_of_the_earlier_format_verifies_keyed_and_names_an_edit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keyed(monkeypatch)
    path = tmp_path / "audit.db"
    shutil.copy(FIXTURE, path)
    reader = Notifier.open(tmp_path / "elsewhere.db", config=config())
    result = reader.verify_export(path)
    assert result.findings == ()
    assert [(v.verdict.value, v.findings) for v in result.runs] == [("keyed", ())]
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE items SET state = 'sent' WHERE seq = 2")
    edited = reader.verify_export(path)
    assert {(d.table.value, d.row, d.column) for d in edited.findings} == {
        ("items", "item seq 2", "seal")
    }
    assert [(d.row, d.column) for v in edited.runs for d in v.findings] == [
        ("item u2 (seq 2)", "state")
    ]
