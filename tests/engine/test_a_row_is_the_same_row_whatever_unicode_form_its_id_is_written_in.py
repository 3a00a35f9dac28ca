"""A row's `id` names one row however Unicode writes it: `café` composed (NFC, one code point
for é) and decomposed (NFD, `e` and a combining accent, as some macOS tools save it) look
the same to the person who wrote them, so they are the same row. A file delivered with its
ids in one form and sent again with them in the other sends nothing again; two rows of one
file whose ids differ only in form are a duplicate id. A database written before row
identities were compared in one form (m019) keeps its delivered rows: the committed
fixture's run, killed mid-send with its ids in NFD, resumes and sends each remaining row
once, and the file then sent again in either form sends nothing. On both stores."""

from __future__ import annotations

import csv
import unicodedata

import pytest

from ..conftest import Workspace
from ..support.workspace import FIXTURES

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(90)]
FIXTURE = "m019-ids-in-nfd"
RUN = "m019-nfd-ids"


def _rows(form: str, count: int) -> list[list[str]]:
    """The fixture's file, its ids (`café-1`…) written in Unicode form `form`."""
    rows = [["id", "to", "subject", "body"]]
    for i in range(1, count + 1):
        own_id = unicodedata.normalize(form, f"café-{i}")  # type: ignore[arg-type]
        rows.append([own_id, f"k{i}@example.com", f"Hello {i}", "Body"])
    return rows


def _outbox_ids(ws: Workspace) -> list[str]:
    return sorted(unicodedata.normalize("NFC", d["item_id"]) for d in ws.outbox_documents())


@pytest.mark.parametrize(("first", "then"), [("NFD", "NFC"), ("NFC", "NFD")])
def test_a_file_sent_again_with_its_ids_in_another_unicode_form_sends_nothing_again(
    ws: Workspace, first: str, then: str
) -> None:
    """Four rows delivered with their ids in one form; the same file with them in the other
    and a fifth row: only the fifth is sent."""
    (ws.path / "notifier.toml").write_text('[channels.files]\ntype = "outbox"\n')
    ws.write_csv("b.csv", _rows(first, 4))
    assert ws.invoke("send", "b.csv", "--channel", "files", "--concurrency", "8").exit_code == 0
    ws.write_csv("b.csv", _rows(then, 5))
    again = ws.invoke("send", "b.csv", "--channel", "files", "--concurrency", "8")
    assert again.exit_code == 0, again.output
    assert _outbox_ids(ws) == sorted(f"café-{i}" for i in range(1, 6))


def test_one_id_written_in_two_unicode_forms_in_one_file_is_a_duplicate_id(
    ws: Workspace,
) -> None:
    """Both spellings of `café-1` in one file: refused (exit 2), both lines named, nothing
    stored or sent."""
    (ws.path / "notifier.toml").write_text('[channels.files]\ntype = "outbox"\n')
    rows = [*_rows("NFC", 2), _rows("NFD", 1)[1]]
    ws.write_csv("b.csv", rows)
    refused = ws.invoke("send", "b.csv", "--channel", "files")
    assert refused.exit_code == 2, refused.output
    assert "duplicate id" in refused.output and "line 2" in refused.output, refused.output
    assert ws.outbox_documents() == []
    assert not ws.has_database() or ws.ledger.runs() == []


def test_a_run_killed_before_the_upgrade_resumes_and_its_rows_are_never_sent_again(
    ws: Workspace,
) -> None:
    """The fixture: café-1…6 sent and café-7 written before the kill, ids in NFD. Resume at
    concurrency 8 (items claimed ahead) settles café-7 by asking the outbox and sends the
    rest, each once; the file sent again, its ids in NFC or as they were, sends nothing."""
    ws.load_fixture(FIXTURE)
    resumed = ws.invoke("resume", RUN, "--concurrency", "8")
    assert resumed.exit_code == 0, resumed.output
    assert "m019_row_identity_in_nfc" in ws.ledger.migrations()
    assert ws.ledger.state_counts(RUN) == {"sent": 12}
    every = sorted(f"café-{i}" for i in range(1, 13))
    assert _outbox_ids(ws) == every
    for form in ("NFC", "NFD"):
        ws.write_csv("b.csv", _rows(form, 12))
        again = ws.invoke("send", "b.csv", "--channel", "files")
        assert again.exit_code == 0, again.output
        assert _outbox_ids(ws) == every
    with (FIXTURES / f"{FIXTURE}.csv").open(newline="", encoding="utf-8") as handle:
        assert list(csv.reader(handle)) == _rows("NFD", 12)  # the fixture's file, as sent
