"""A row without an `id` is the notification its file says, to whom and through which
channel: not when it may still go, nor how an editor saved its line breaks. Its deadline
(`--not-after`, or its `not_after` column) and line breaks written `\\r\\n` or `\\n` inside a
quoted cell are no part of its identity, so the same file sent again with another deadline,
with none, or saved by another editor, sends no delivered row again, and sends the rows an
earlier run never delivered. A database written before the identity left them out (m021)
keeps its delivered rows: the committed fixture's run, killed mid-send with a deadline and
`\\r\\n` in its bodies, resumes and sends each remaining row once, and its file then sent
again, saved with `\\n` and with another deadline or none, sends nothing. On both stores."""

from __future__ import annotations

from collections import Counter, deque

import pytest

from notifier.domain.intent import digest_of_normalised, payload_json

from ..conftest import Workspace
from ..fake_messages import FakeMessages, tool_answer
from ..support.workspace import FIXTURES

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(90)]
FIXTURE = "m021-deadlines-and-crlf"
RUN = "m021-deadlines"
PAST = "2020-01-01T00:00:00Z"
SOON = "2099-01-01T00:00:00Z"
LATER = "2099-06-01T00:00:00Z"
DEADLINES = {"later": ["--not-after", LATER], "none": []}


def _rows(count: int, *, breaks: str = "\n") -> list[list[str]]:
    """The fixture's file: no `id` column, each body two lines apart by `breaks`."""
    rows = [["to", "subject", "body"]]
    for i in range(1, count + 1):
        rows.append([f"k{i}@example.com", f"Hello {i}", f"Dear {i},{breaks}see you."])
    return rows


def _deliveries(ws: Workspace) -> Counter[str]:
    """How many documents the outbox holds for each recipient."""
    return Counter(document["to"] for document in ws.outbox_documents())


def _each_once(count: int) -> Counter[str]:
    return Counter(f"k{i}@example.com" for i in range(1, count + 1))


def _send(ws: Workspace, *options: str) -> None:
    sent = ws.invoke("send", "b.csv", "--channel", "files", "--concurrency", "8", *options)
    assert sent.exit_code == 0, sent.output


@pytest.mark.parametrize("then", sorted(DEADLINES))
def test_a_file_sent_again_with_another_deadline_sends_no_row_again(
    ws: Workspace, then: str
) -> None:
    """Four rows delivered with a deadline; the same file with a later deadline, or none,
    and a fifth row: only the fifth is sent."""
    (ws.path / "notifier.toml").write_text('[channels.files]\ntype = "outbox"\n')
    ws.write_csv("b.csv", _rows(4))
    _send(ws, "--not-after", SOON)
    ws.write_csv("b.csv", _rows(5))
    _send(ws, *DEADLINES[then])
    assert _deliveries(ws) == _each_once(5)
    verified = ws.invoke("verify")  # each identity has a form its row can have
    assert verified.exit_code == 0, verified.output


def test_a_deadline_column_changed_sends_no_row_again(ws: Workspace) -> None:
    """The deadline in a `not_after` column of the file, moved later between two sends."""
    (ws.path / "notifier.toml").write_text('[channels.files]\ntype = "outbox"\n')
    for deadline in (SOON, LATER):
        rows = [[*row, "not_after" if i == 0 else deadline] for i, row in enumerate(_rows(3))]
        ws.write_csv("b.csv", rows)
        _send(ws)
    assert _deliveries(ws) == _each_once(3)


@pytest.mark.parametrize(("first", "then"), [("\r\n", "\n"), ("\n", "\r\n"), ("\r", "\n")])
def test_a_file_saved_again_with_other_line_breaks_sends_no_row_again(
    ws: Workspace, first: str, then: str
) -> None:
    """Line breaks inside quoted bodies written one way, then the other: nothing again."""
    (ws.path / "notifier.toml").write_text('[channels.files]\ntype = "outbox"\n')
    ws.write_csv("b.csv", _rows(4, breaks=first))
    _send(ws)
    ws.write_csv("b.csv", _rows(4, breaks=then))
    _send(ws)
    assert _deliveries(ws) == _each_once(4)


@pytest.mark.parametrize("n", [1, 8])
def test_the_rows_that_expired_go_out_with_a_later_deadline_and_no_other_row(
    ws: Workspace, n: int
) -> None:
    """Rows 1-8 delivered; the file of 24 rows sent with a deadline already past (allowed):
    1-8 left out, 9-24 expire unsent; the file sent again with a later deadline, at
    concurrency `n`, delivers exactly 9-24, each once."""
    (ws.path / "notifier.toml").write_text('[channels.files]\ntype = "outbox"\n')
    ws.write_csv("b.csv", _rows(8))
    _send(ws, "--not-after", SOON)
    ws.write_csv("b.csv", _rows(24))
    expired = ws.invoke(
        "send", "b.csv", "--channel", "files", "--not-after", PAST, "--allow-expired"
    )
    assert expired.exit_code == 3, expired.output  # 16 expired, never sent
    assert "8 row(s) already delivered" in expired.output, expired.output
    assert _deliveries(ws) == _each_once(8)
    again = ws.invoke(
        "send", "b.csv", "--channel", "files", "--concurrency", str(n), "--not-after", LATER
    )
    assert again.exit_code == 0, again.output
    assert _deliveries(ws) == _each_once(24)


def test_a_run_killed_before_the_upgrade_resumes_and_its_rows_are_never_sent_again(
    ws: Workspace,
) -> None:
    """The fixture: rows 1-6 sent and row 7 written before the kill, all with a deadline and
    `\\r\\n` in their bodies. Resume at concurrency 8 (items claimed ahead) settles row 7 by
    asking the outbox and sends the rest, each once; the file sent again with `\\n` and a
    later deadline, or none, sends nothing."""
    ws.load_fixture(FIXTURE)
    resumed = ws.invoke("resume", RUN, "--concurrency", "8")
    assert resumed.exit_code == 0, resumed.output
    assert ws.ledger.state_counts(RUN) == {"sent": 12}
    assert _deliveries(ws) == _each_once(12)
    assert "m021_rows_without_ids_by_their_row_digest" in ws.ledger.migrations()
    verified = ws.invoke("verify", RUN)
    assert verified.exit_code == 0, verified.output
    for then in sorted(DEADLINES):
        ws.write_csv("b.csv", _rows(12))
        _send(ws, *DEADLINES[then])
        assert _deliveries(ws) == _each_once(12)
    fixture_file = (FIXTURES / f"{FIXTURE}.csv").read_bytes()
    assert fixture_file.count(b"\r\nsee you.") == 12  # the fixture's file, as sent


def _with_ids(rows: list[list[str]]) -> list[list[str]]:
    return [["id", *rows[0]], *([f"r{i}", *row] for i, row in enumerate(rows[1:], 1))]


@pytest.mark.parametrize("ids_first", [True, False], ids=["dropped", "added"])
def test_a_file_with_a_deadline_named_otherwise_is_still_compared_with_what_it_delivered(
    ws: Workspace, ids_first: bool
) -> None:
    """Three rows with a deadline and `\\r\\n` in their bodies delivered with an `id` column
    (or without); the same file, same deadline, without it (or with it): refused (exit 2),
    nothing more sent, as for rows without a deadline."""
    (ws.path / "notifier.toml").write_text('[channels.files]\ntype = "outbox"\n')
    rows = _rows(3, breaks="\r\n")
    first, then = (_with_ids(rows), rows) if ids_first else (rows, _with_ids(rows))
    ws.write_csv("b.csv", first)
    _send(ws, "--not-after", SOON)
    ws.write_csv("b.csv", then)
    refused = ws.invoke("send", "b.csv", "--channel", "files", "--not-after", SOON)
    assert refused.exit_code == 2, refused.output
    assert "3 row(s) have the channel, recipient and content" in refused.output
    assert _deliveries(ws) == _each_once(3)


def test_a_composed_row_stored_under_its_deadline_is_moved_to_its_row_digest(
    ws: Workspace, fake: FakeMessages
) -> None:
    """A file without ids composed with a deadline and `\\r\\n` in its bodies, as the code
    before m021 stored it: its drafts' source digests and its items' identities the source
    rows' intent digests, deadline and line breaks included (written back here, m021 not
    yet applied). Once migrated, the file composed again with another deadline, whatever
    the model writes this time, sends nothing."""
    (ws.path / "notifier.toml").write_text('[channels.files]\ntype = "outbox"\n')
    (ws.path / "brief.txt").write_text("Say hello to the person.")
    rows = _rows(2, breaks="\r\n")
    ws.write_csv("b.csv", rows)
    compose = ("send", "b.csv", "--compose", "brief.txt", "--channel", "files")
    first = ws.invoke(*compose, "--not-after", SOON)
    assert first.exit_code == 0, first.output
    for seq, (to, subject, body) in enumerate(rows[1:], 1):
        payload = payload_json(subject, body, {}, "2099-01-01T00:00:00.000000+00:00")
        before = digest_of_normalised("files", to, payload)
        ws.write("UPDATE drafts SET source_digest = ? WHERE seq = ?", (before, seq))
        ws.write("UPDATE items SET identity = ? WHERE seq = ?", (before, seq))
    table = "notifier_migrations" if ws.url else "_sqlite_migrations"
    ws.write(f"DELETE FROM {table} WHERE name = ?", ("m021_rows_without_ids_by_their_row_digest",))
    for row in ("1", "2"):
        fake.per_row[row] = deque([tool_answer("Hi again", f"A new wording for row {row}.")])
    again = ws.invoke(*compose, "--not-after", LATER)
    assert again.exit_code == 0, again.output
    assert _deliveries(ws) == _each_once(2)


@pytest.mark.parametrize("then", sorted(DEADLINES))
def test_a_file_given_an_id_column_and_another_deadline_is_refused_never_sent_twice(
    ws: Workspace, then: str
) -> None:
    """Three rows without ids delivered with a deadline and `\\r\\n` in their bodies; the same
    file given an `id` column, saved with `\\n`, with a later deadline or none: its rows
    have the content of rows delivered by a file that named them otherwise, refused (exit 2)
    as with the same deadline, never each sent a second time."""
    (ws.path / "notifier.toml").write_text('[channels.files]\ntype = "outbox"\n')
    ws.write_csv("b.csv", _rows(3, breaks="\r\n"))
    _send(ws, "--not-after", SOON)
    ws.write_csv("b.csv", _with_ids(_rows(3)))
    refused = ws.invoke("send", "b.csv", "--channel", "files", *DEADLINES[then])
    assert refused.exit_code == 2, refused.output
    assert "3 row(s) have the channel, recipient and content" in refused.output
    assert _deliveries(ws) == _each_once(3)


def test_an_identity_rewritten_to_its_deadline_bearing_digest_is_named_by_verify(
    ws: Workspace,
) -> None:
    """The form such a row had before m021 (its intent digest, deadline included), written
    back behind notifier's back: the next send with a later deadline would deliver it
    again, so `verify` names it (exit 5)."""
    (ws.path / "notifier.toml").write_text('[channels.files]\ntype = "outbox"\n')
    ws.write_csv("b.csv", _rows(3))
    _send(ws, "--not-after", SOON)
    ws.write("UPDATE items SET identity = intent_digest WHERE seq = 2")
    found = ws.invoke("verify")
    assert found.exit_code == 5, found.output
    assert "item 2 (seq 2)" in found.output and "identity" in found.output, found.output


@pytest.mark.parametrize("then", sorted(DEADLINES))
def test_a_file_whose_id_column_is_dropped_and_deadline_changed_is_refused_never_sent_twice(
    ws: Workspace, then: str
) -> None:
    """Three rows delivered with an `id` column, a deadline and `\\r\\n` in their bodies; the
    same file without its `id` column, saved with `\\n`, with a later deadline or none: its
    rows have the content of rows delivered by a file that named them otherwise, refused
    (exit 2) as with the same deadline, never each sent a second time."""
    (ws.path / "notifier.toml").write_text('[channels.files]\ntype = "outbox"\n')
    ws.write_csv("b.csv", _with_ids(_rows(3, breaks="\r\n")))
    _send(ws, "--not-after", SOON)
    ws.write_csv("b.csv", _rows(3))
    refused = ws.invoke("send", "b.csv", "--channel", "files", *DEADLINES[then])
    assert refused.exit_code == 2, refused.output
    assert "3 row(s) have the channel, recipient and content" in refused.output
    assert _deliveries(ws) == _each_once(3)


def test_a_run_with_ids_killed_before_the_upgrade_resumes_and_its_rows_are_never_sent_again(
    ws: Workspace,
) -> None:
    """The fixture m022: a file with an `id` column, a deadline and `\\r\\n` in its bodies,
    rows 1-6 sent and row 7 written before the kill, by the code before items with ids kept
    their row digest. Resume at concurrency 8 (items claimed ahead) settles row 7 by asking
    the outbox and sends the rest, each once; the file then sent without its id column,
    saved with `\\n`, with a later deadline or none, is refused (exit 2), nothing sent."""
    ws.load_fixture("m022-ids-deadlines-and-crlf")
    resumed = ws.invoke("resume", "m022-ids", "--concurrency", "8")
    assert resumed.exit_code == 0, resumed.output
    assert ws.ledger.state_counts("m022-ids") == {"sent": 12}
    assert _deliveries(ws) == _each_once(12)
    assert "m022_rows_with_ids_by_their_row_digest_too" in ws.ledger.migrations()
    for then in sorted(DEADLINES):
        ws.write_csv("b.csv", _rows(12))
        refused = ws.invoke("send", "b.csv", "--channel", "files", *DEADLINES[then])
        assert refused.exit_code == 2, refused.output
        assert "12 row(s) have the channel, recipient and content" in refused.output
        assert _deliveries(ws) == _each_once(12)
    fixture_file = (FIXTURES / "m022-ids-deadlines-and-crlf.csv").read_bytes()
    assert fixture_file.count(b"\r\nsee you.") == 12  # the fixture's file, as sent


@pytest.mark.parametrize("rewrite", ["NULL", "intent_digest"])
def test_a_row_digest_of_an_item_with_an_id_rewritten_is_named_by_verify(
    ws: Workspace, rewrite: str
) -> None:
    """An item with an id and a deadline keeps its row digest; cleared (or made its intent
    digest) behind notifier's back, the same file sent without its id column and another
    deadline would deliver it again, so `verify` names it (exit 5)."""
    (ws.path / "notifier.toml").write_text('[channels.files]\ntype = "outbox"\n')
    ws.write_csv("b.csv", _with_ids(_rows(3)))
    _send(ws, "--not-after", SOON)
    assert ws.invoke("verify").exit_code == 0
    ws.write(f"UPDATE items SET row_digest = {rewrite} WHERE seq = 2")
    found = ws.invoke("verify")
    assert found.exit_code == 5, found.output
    assert "item r2 (seq 2)" in found.output and "row_digest" in found.output, found.output
