"""A row composed and delivered, without an `id` column, by a version from before composed
rows had the identity of their source row (and every composed run from before m006, which
back-filled id-less items with their intent digest) is stored under its drafted text's
digest. After the upgrade, the same file composed again must send nothing
twice, however the model words the new draft, and sent as written it must count as changed
(refused), as it does for a row composed by this version. The fixture is that version's
database (tests/fixtures/README.md says how it was made). On both stores."""

from __future__ import annotations

import shutil
from collections import deque

import psycopg
import pytest

from ..conftest import Workspace
from ..fake_messages import FakeMessages, tool_answer
from ..support.workspace import FIXTURES

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(90)]
FIXTURE = "m010-composed-drafted-identity"


def _load(ws: Workspace) -> None:
    if ws.url:
        with psycopg.connect(ws.url, autocommit=True) as conn:
            conn.execute((FIXTURES / f"{FIXTURE}-pg.sql").read_text().encode())
    else:
        shutil.copy(FIXTURES / f"{FIXTURE}.db", ws.db_file)
    (ws.path / "notifier.toml").write_text('[channels.files]\ntype = "outbox"\n')
    shutil.copy(FIXTURES / f"{FIXTURE}.csv", ws.path / "rows.csv")
    (ws.path / "brief.txt").write_text("Say hello to the person, by name.")


def test_a_row_composed_before_is_not_composed_and_sent_again(
    ws: Workspace, fake: FakeMessages
) -> None:
    """The model words its drafts otherwise this time (as a real one does): neither row
    reaches its recipient again."""
    _load(ws)
    for row in ("1", "2"):
        fake.per_row[row] = deque([tool_answer("Hi again", f"A new wording for row {row}.")])
    again = ws.invoke("send", "rows.csv", "--compose", "brief.txt", "--channel", "files")
    assert ws.outbox_documents() == [], again.output


def test_a_row_composed_before_and_sent_as_written_counts_as_changed(ws: Workspace) -> None:
    _load(ws)
    plain = ws.invoke("send", "rows.csv", "--channel", "files")
    assert ws.outbox_documents() == [], plain.output
    assert plain.exit_code == 2, plain.output
