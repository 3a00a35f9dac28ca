"""A row composed and delivered by a version whose composed rows kept their `tz` and
`not_before` columns in their data, and so in their identity (the schema at m010), is the same
row once m012 has run: composing the same file again sends nothing twice, on both engines;
and m018 keeps with each of its drafts the content of the row it was drafted from as that
row reads now, the content a later file names it by. The fixture is that version's database
(tests/fixtures/README.md says how it was made)."""

from __future__ import annotations

import shutil
from pathlib import Path

import psycopg
import pytest

from notifier.store import Store

from ..conftest import Workspace
from ..fake_messages import FakeMessages

pytestmark = pytest.mark.both_stores
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def _load(ws: Workspace) -> None:
    if ws.url:
        with psycopg.connect(ws.url, autocommit=True) as conn:
            sql = (FIXTURES / "m010-composed-tz-column-pg.sql").read_text()
            conn.execute(sql.encode())
    else:
        shutil.copy(FIXTURES / "m010-composed-tz-column.db", ws.db_file)


def test_a_row_composed_before_is_not_composed_and_sent_again(
    ws: Workspace, fake: FakeMessages
) -> None:
    _load(ws)
    (ws.path / "notifier.toml").write_text('[channels.files]\ntype = "outbox"\n')
    shutil.copy(FIXTURES / "m010-composed-tz-column.csv", ws.path / "rows.csv")
    (ws.path / "brief.txt").write_text("Say hello to the person, by name.")
    again = ws.invoke("send", "rows.csv", "--compose", "brief.txt", "--channel", "files")
    assert again.exit_code == 0, again.output
    assert ws.outbox_documents() == [], again.output
    assert "2 row(s) already delivered" in again.output
    assert fake.requests == []


def test_each_draft_keeps_the_content_of_its_source_row_as_it_reads_now(ws: Workspace) -> None:
    """Back-filled by m018 from the stored source rows (their `tz` column left out of the
    data, as m012 left it out of the rows' identities): for these rows without an `id`, the
    source content is exactly their identity."""
    _load(ws)
    Store.open(ws.db).close()
    rows = ws.query(
        "SELECT d.source_digest, i.identity FROM drafts d JOIN items i "
        "ON i.run_id = d.run_id AND i.seq = d.seq ORDER BY d.seq"
    )
    assert len(rows) == 2 and all(digest == identity for digest, identity in rows), rows
