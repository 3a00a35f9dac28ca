"""CSV reading: every rejection of docs/design.md section 11 stops before anything is stored, and
the awkward-but-valid files (BOM, CRLF, quoted newlines, non-ASCII) are read correctly."""

from __future__ import annotations

import csv
import errno
import io
import re
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from notifier.content import text_rules
from notifier.content.batch_csv import BatchError, read_batch
from notifier.domain.intent import invisible_character
from notifier.domain.text import CONTROL

from ..conftest import Workspace

TYPES = {"outbox": "outbox"}

REJECTIONS = {
    "missing_header": (
        b"ada@example.com,Hi,Body\r\nbob@example.com,Hi,Body\r\n",
        1,
        "looks like a data row",
    ),
    "missing_to_column": (b"email,subject\nada@example.com,Hi\n", 1, "no `to` column"),
    "duplicate_header": (b"to,subject,Subject\nada@example.com,a,b\n", 1, "duplicate header"),
    "empty_to": (b"to,subject\nada@example.com,a\n  ,b\n", 3, "empty `to`"),
    "duplicate_id": (
        b"id,to\nx1,ada@example.com\nx2,bob@example.com\nx1,cy@example.com\n",
        4,
        "duplicate id 'x1' (first used on line 2)",
    ),
    "unknown_channel": (b"to,channel\nada@example.com,pager\n", 2, "unknown channel 'pager'"),
    "undecodable": (b"to,subject\nada@example.com,caf\xe9\n", 2, "not UTF-8"),
    "ragged": (b"to,subject,body\nada@example.com,Hi\n", 2, "2 fields but the header has 3"),
    "empty_file": (b"", 1, "the file is empty"),
    "header_only": (b"to,subject\n", 2, "no rows"),
    "line_break_in_to": (b'to,subject\n"ada@example.com\nBcc: x@evil.test",Hi\n', 2, "line break"),
    "unclosed_quote": (b'to,subject\nada@example.com,"Hi\n', 2, "malformed CSV"),
    "semicolons": (b"to;subject\nada@example.com;Hi\n", 1, "separated by semicolons"),
    # Two files joined (`cat a.csv b.csv`): the second header is no notification to "to".
    "header_repeated": (
        b"to,subject\nada@example.com,Hi\n To , SUBJECT\nbob@example.com,Hi\n",
        3,
        "repeats the header",
    ),
    "field_over_cap": (b'to,body\nada@example.com,"' + b"x" * (5 << 20) + b'"\n', 2, "longer than"),
    "not_after_past_the_last_date": (
        b"to,not_after\nada@example.com,9999-12-31T23:59:59-05:00\n",
        2,
        "`not_after` '9999-12-31T23:59:59-05:00' is out of range",
    ),
    "not_before_before_the_first_date": (
        b"to,not_before\nada@example.com,0001-01-01T00:00:00+05:00\n",
        2,
        "`not_before` '0001-01-01T00:00:00+05:00' is out of range",
    ),
}


@pytest.mark.parametrize("case", sorted(REJECTIONS))
def test_rejected_file_exits_2_and_stores_nothing(ws: Workspace, case: str) -> None:
    """Each rejection names the file and the line, exits 2, and leaves no database, no run and
    no outbox file behind."""
    content, line, message = REJECTIONS[case]
    batch = ws.path / f"{case}.csv"
    batch.write_bytes(content)
    result = ws.invoke("send", str(batch))
    assert result.exit_code == 2, result.output
    assert str(batch) in result.output
    assert f"line {line}: " in result.output
    assert message in result.output
    assert "Traceback" not in result.output
    assert not ws.db_file.exists()
    assert not ws.outbox.exists()


def test_rejection_with_an_existing_database_adds_no_run(ws: Workspace) -> None:
    """A bad file sent against a database that already holds a run changes nothing in it."""
    ws.write_csv("good.csv", [["to"], ["ada@example.com"]])
    assert ws.invoke("send", "good.csv").exit_code == 0
    before = ws.ledger.runs(), ws.ledger.items()
    (ws.path / "bad.csv").write_bytes(b"to,subject\n,Hi\n")
    assert ws.invoke("send", "bad.csv").exit_code == 2
    assert (ws.ledger.runs(), ws.ledger.items()) == before


def test_only_the_first_20_problems_are_listed_then_a_count(tmp_path: Path) -> None:
    """A file with 25 bad rows lists 20 of them and says how many more there are."""
    batch = tmp_path / "many.csv"
    batch.write_text("to,subject\n" + ",Hi\n" * 25, "utf-8")
    with pytest.raises(BatchError) as caught:
        read_batch(batch, TYPES, "outbox")
    text = caught.value.render()
    assert len(caught.value.problems) == 25
    assert text.count("empty `to`") == 20
    assert "… and 5 more." in text
    assert "line 2:" in text and "line 21:" in text and "line 22:" not in text


def test_bom_crlf_quoted_commas_newlines_and_unicode_are_read(ws: Workspace) -> None:
    """A spreadsheet-style export (BOM, CRLF, quoted commas and newlines, accents) plans and
    sends with every character intact."""
    text = (
        "\ufeffid,to,subject,body,city\r\n"
        'a1,zoë@example.com,"Bienvenue, Zoë","Ligne 1\r\nLigne 2, avec virgule",Zürich\r\n'
        'a2,ren@example.com,"He said ""hi""",Plain,São Paulo\r\n'
    )
    (ws.path / "export.csv").write_bytes(text.encode("utf-8"))
    result = ws.invoke("send", "export.csv")
    assert result.exit_code == 0, result.output
    documents = {d["item_id"]: d for d in ws.outbox_documents()}
    assert documents["a1"]["subject"] == "Bienvenue, Zoë"
    assert documents["a1"]["body"] == "Ligne 1\r\nLigne 2, avec virgule"
    assert documents["a1"]["data"] == {"city": "Zürich"}
    assert documents["a2"]["subject"] == 'He said "hi"'
    assert documents["a2"]["data"] == {"city": "São Paulo"}
    payload = ws.ledger.payload(ws.ledger.item("a1").seq)
    assert payload["subject"] == "Bienvenue, Zoë"


def test_blank_lines_are_skipped_and_positions_are_item_ids(tmp_path: Path) -> None:
    """Without an id column the row's position is its id; blank lines carry nothing."""
    batch = tmp_path / "plain.csv"
    batch.write_text("to\n\nada@example.com\n\nbob@example.com\n", "utf-8")
    rows = read_batch(batch, TYPES, "outbox")
    assert [(r.seq, r.item_id, r.to, r.line) for r in rows] == [
        (1, "1", "ada@example.com", 3),
        (2, "2", "bob@example.com", 5),
    ]


# csv.writer only quotes a lone CR when CR is part of its line terminator, so an LF file it
# writes with a bare CR in a cell is genuinely ambiguous; quoted CRLF is pinned above.
CELL = st.text(
    alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="\x00\r"),
    max_size=30,
)
# No control character, C0 or C1, nor a line or paragraph separator (domain/text.py).
ONE_LINE = CELL.map(lambda s: "".join(c for c in s if not CONTROL.match(c)))
# A recipient holds no character nobody sees either (intent.invisible_character).
TO = ONE_LINE.map(lambda s: "".join(c for c in s if invisible_character(c) is None))
# A body may hold tabs and line breaks, no other control character (text_rules.py).
BODY = CELL.map(lambda s: "".join(c for c in s if not text_rules.BODY_CONTROL.match(c)))


@settings(max_examples=150, deadline=None)
@given(
    rows=st.lists(
        st.tuples(TO.filter(lambda s: s.strip() != ""), ONE_LINE, BODY, CELL),
        min_size=1,
        max_size=15,
    ),
    crlf=st.booleans(),
    bom=st.booleans(),
)
def test_any_well_formed_csv_round_trips(
    tmp_path_factory: pytest.TempPathFactory,
    rows: list[tuple[str, str, str, str]],
    crlf: bool,
    bom: bool,
) -> None:
    """Whatever text a cell holds (commas, quotes, newlines, any script), a file written by
    csv.writer is read back with the same values, in order."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\r\n" if crlf else "\n")
    writer.writerow(["to", "subject", "body", "note"])
    writer.writerows(rows)
    path = tmp_path_factory.mktemp("csv") / "batch.csv"
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + buffer.getvalue().encode("utf-8"))
    try:
        parsed = read_batch(path, TYPES, "outbox")
    except BatchError as exc:
        # The only legitimate refusal: a row whose every cell is blank is skipped, so a file
        # made only of such rows has no rows.
        assert all(not any(c.strip() for c in r) for r in rows), exc.render()
        return
    expected = [r for r in rows if any(c.strip() for c in r)]
    assert [(p.to, p.subject, p.body, p.data["note"]) for p in parsed] == [
        (t.strip(), s, b, n) for t, s, b, n in expected
    ]


def test_a_quoted_200_kb_body_is_accepted(ws: Workspace) -> None:
    """A long but correctly quoted body (past the csv module's 128 KiB default) is read whole."""
    body = "<p>" + "x" * 200_000 + "</p>"
    ws.write_csv("long.csv", [["to", "body"], ["ada@example.com", body]])
    result = ws.invoke("send", "long.csv")
    assert result.exit_code == 0, result.output
    assert ws.outbox_documents()[0]["body"] == body


def test_an_smtp_address_the_channel_would_refuse_fails_the_file(ws: Workspace) -> None:
    """`x@a..b.example` is rejected while planning, by the SMTP channel's own rules, instead
    of failing mid-run after other items were sent."""
    (ws.path / "notifier.toml").write_text(
        '[channels.mail]\ntype = "smtp"\nhost = "127.0.0.1"\nport = 2525\n'
        'sender = "ops@example.com"\n'
    )
    ws.write_csv("mail.csv", [["to"], ["ok@example.com"], ["x@a..b.example"]])
    result = ws.invoke("send", "mail.csv", "--channel", "mail")
    assert result.exit_code == 2, result.output
    assert "line 3: " in result.output and "malformed" in result.output
    assert not ws.db_file.exists()


@pytest.mark.parametrize(
    "spelling",
    ["ann@exam\u200bple.com", "ann@exa\u00admple.com", "ann@\uff45xample.com"],
    ids=["zero-width-space", "soft-hyphen", "fullwidth"],
)
def test_an_smtp_domain_that_would_change_on_the_wire_fails_the_file(
    ws: Workspace, spelling: str
) -> None:
    """Encoding a domain for the envelope drops a zero-width space or a soft hyphen and maps
    fullwidth letters: the relay would get ann@example.com, which the suppression list (or
    another row) knows under that spelling, not this one. Refused while planning, exit 2,
    nothing stored; a real internationalised domain still goes."""
    (ws.path / "notifier.toml").write_text(
        '[channels.mail]\ntype = "smtp"\nhost = "127.0.0.1"\nport = 2525\n'
        'sender = "ops@example.com"\n'
    )
    ws.write_csv("mail.csv", [["to"], ["ok@b\u00fccher.de"], [spelling]])
    result = ws.invoke("send", "mail.csv", "--channel", "mail")
    assert result.exit_code == 2, result.output
    assert "line 3: " in result.output and "'example.com'" in result.output, result.output
    assert "line 2: " not in result.output, result.output
    assert not ws.db_file.exists()


@pytest.mark.parametrize(
    "spelling", ["ann@stra\u00dfe.de", "ann@\u03c3\u03bf\u03c6\u03af\u03b1\u03c2.gr"]
)
def test_an_smtp_domain_the_two_idna_standards_spell_apart_fails_the_file(
    ws: Workspace, spelling: str
) -> None:
    """`straße.de` goes on the wire as `strasse.de` by IDNA 2003 (what the envelope's
    encoding does) and as `xn--strae-oqa.de` by IDNA 2008 (what the domain is registered
    as): another domain, not the one the row names. Refused while planning, exit 2, naming
    the punycode to write; that spelling is accepted."""
    (ws.path / "notifier.toml").write_text(
        '[channels.mail]\ntype = "smtp"\nhost = "127.0.0.1"\nport = 2525\n'
        'sender = "ops@example.com"\n'
    )
    ws.write_csv("mail.csv", [["to"], ["ok@b\u00fccher.de"], [spelling]])
    result = ws.invoke("send", "mail.csv", "--channel", "mail", "--dry-run")
    assert result.exit_code == 2, result.output
    assert "line 3: " in result.output and "xn--" in result.output, result.output
    assert not ws.db_file.exists()
    punycode = re.search(r"'(xn--[^']+)'", result.output)
    assert punycode, result.output
    local = spelling.split("@", maxsplit=1)[0]
    ws.write_csv("mail.csv", [["to"], [f"{local}@{punycode.group(1)}"]])
    assert ws.invoke("send", "mail.csv", "--channel", "mail", "--dry-run").exit_code == 0


@pytest.mark.parametrize("listed", ["ann@example.com,bob@example.com", "ann@x.org; bob@x.org"])
def test_an_apprise_row_whose_to_holds_a_list_fails_the_file(ws: Workspace, listed: str) -> None:
    """Apprise splits a URL's target at commas, semicolons and spaces: a row's `to` holding
    a list would reach each address in it, past the suppression list, which knows it as one.
    Refused while planning, exit 2, nothing stored."""
    (ws.path / "notifier.toml").write_text(
        '[channels.alerts]\ntype = "apprise"\n'
        'urls = ["mailto://127.0.0.1:2525/?from=ops@example.com&to={to}"]\n'
    )
    ws.write_csv("a.csv", [["to", "subject", "body"], ["ann@example.com", "Hi", "B"],
                           [listed, "Hi", "B"]])  # fmt: skip
    result = ws.invoke("send", "a.csv", "--channel", "alerts")
    assert result.exit_code == 2, result.output
    assert "line 3: " in result.output and "holds a list" in result.output, result.output
    assert "line 2: " not in result.output, result.output
    assert not ws.db_file.exists()


def test_duplicate_ids_far_apart_are_listed_in_file_order(ws: Workspace) -> None:
    """Ids are checked a chunk of rows at a time, yet a duplicate across chunks and one
    inside a chunk are both found, and listed in line order among the other problems."""
    rows = [["id", "to"]] + [[f"x{i}", f"u{i}@example.com"] for i in range(1, 12_001)]
    rows[6_000] = ["x2", "dup@example.com"]  # line 6,001 reuses line 3's id (another chunk)
    rows[6_001] = ["x6001", ""]  # line 6,002: empty `to`, found before the chunk is checked
    rows[11_000] = ["x10999", "again@example.com"]  # line 11,001 reuses line 11,000's id
    ws.write_csv("dups.csv", rows)
    result = ws.invoke("send", "dups.csv")
    assert result.exit_code == 2, result.output
    listed = [line for line in result.output.splitlines() if line.strip().startswith("line ")]
    assert listed == [
        "  line 6001: duplicate id 'x2' (first used on line 3): ids must be unique",
        "  line 6002: empty `to`: every row needs a recipient",
        "  line 11001: duplicate id 'x10999' (first used on line 11000): ids must be unique",
    ]
    assert not ws.db_file.exists()


def test_identical_rows_without_ids_are_refused_naming_both_lines(ws: Workspace) -> None:
    """Without an `id` column, a row whose channel, recipient and content repeat an earlier
    line would reach the same person twice: the file is refused (exit 2, nothing stored),
    naming both lines, while rows that differ in recipient, content or channel pass, and
    `--allow-duplicates` sends every copy."""
    (ws.path / "notifier.toml").write_text("[channels.other]\ntype = 'outbox'\n")
    ws.write_csv(
        "same.csv",
        [["to", "subject", "body", "channel"],
         ["ada@example.com", "Hi", "Body", "outbox"],
         ["bob@example.com", "Hi", "Body", "outbox"],  # another recipient
         ["", "", "", ""],  # a blank line: lines, not rows, are named
         [" ada@EXAMPLE.com ", "Hi", "Body", "outbox"],  # the same recipient, normalised
         ["ada@example.com", "Hi", "Other body", "outbox"],  # other content
         ["ada@example.com", "Hi", "Body", "other"],  # another channel
         ["ada@example.com", "Hi", "Body", "outbox"]],
    )  # fmt: skip
    refused = ws.invoke("send", "same.csv")
    assert refused.exit_code == 2, refused.output
    listed = [line.strip() for line in refused.output.splitlines() if "line " in line]
    assert [line.split(":")[0] for line in listed if line.startswith("line ")] == [
        "line 5",
        "line 8",
    ]
    assert "as line 2" in listed[0] and "--allow-duplicates" in refused.output
    assert not ws.db_file.exists()
    sent = ws.invoke("send", "same.csv", "--allow-duplicates")
    assert sent.exit_code == 0, sent.output
    assert "6 sent" in sent.output


@pytest.mark.parametrize(
    ("subject", "body", "said"),
    [
        ("Hi", "line one\x00 NUL", "the body contains a control character (U+0000)"),
        ("Hi", "an \x1b[31mESC\x1b[0m", "the body contains a control character (U+001B)"),
        ("x" * 1200, "fine", "the subject is 1200 characters, over 998"),
        ("Bell\x07", "fine", "the subject contains a control character (U+0007)"),
    ],
    ids=["nul", "esc", "long-subject", "bell"],
)
def test_text_breaking_the_content_rules_is_refused_at_plan_time(
    ws: Workspace, subject: str, body: str, said: str
) -> None:
    """The CSV's own text is held to the rules drafted and rendered text is held to (one
    set, text_rules.py): a body with NUL or ESC, or a subject over 998 characters, refuses
    the file (exit 2, its line named), where it was sent raw; tabs and line breaks in a
    body are text."""
    ws.write_csv("b.csv", [["to", "subject", "body"], ["ada@example.com", subject, body],
                           ["bob@example.com", "Fine", "two\tcolumns\r\nand lines"]])  # fmt: skip
    result = ws.invoke("send", "b.csv")
    assert result.exit_code == 2, result.output
    assert f"line 2: {said}" in result.output
    assert "line 3" not in result.output
    assert not ws.db_file.exists()


def test_a_template_rendering_a_control_character_is_refused(ws: Workspace) -> None:
    """A template's output is held to the same rules: an ESC rendered into the body is a
    problem of the row's line (exit 2), never sent."""
    (ws.path / "t.toml").write_text('subject = "Hi {{ name }}"\nbody = "x{{ code }}y"\n')
    ws.write_csv("b.csv", [["to", "name", "code"], ["ada@example.com", "Ada", "\x1b[1m"]])
    result = ws.invoke("send", "b.csv", "--template", "t.toml")
    assert result.exit_code == 2, result.output
    assert "line 2: rendered: the body contains a control character (U+001B)" in result.output


def own_tempdir(ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temporary directory of the test's own for the spools of `send -`: other tests (and
    processes) spool in the shared one meanwhile."""
    tmp = ws.path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    return tmp


def test_a_batch_on_standard_input_is_planned_and_sent_like_a_file(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`send -` reads the rows piped in (the contract: BATCH may be `-`), validates them
    whole, plans and sends them; the run records its source as `-`, sending the same rows
    again plans nothing delivered, and a bad row names its line. No spool is left behind."""
    rows = "id,to,subject,body\nu1,ada@example.com,Hi,Body\nu2,bob@example.com,Hi,Body\n"
    tmp = own_tempdir(ws, monkeypatch)
    result = ws.invoke("send", "-", input=rows)
    assert result.exit_code == 0, result.output
    assert len(ws.outbox_documents()) == 2
    assert ws.status()["batch"] == "-"
    again = ws.invoke("send", "-", input=rows)
    assert again.exit_code == 0, again.output
    assert "already delivered" in again.output and len(ws.outbox_documents()) == 2
    bad = ws.invoke("send", "-", input="to,subject\n,Hi\n")
    assert bad.exit_code == 2, bad.output
    assert "line 2" in bad.output and "Traceback" not in bad.output
    assert list(tmp.iterdir()) == []
    assert "standard input" in " ".join(ws.invoke("send", "--help").output.split())


def test_rows_piped_in_are_named_as_standard_input_when_refused(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refusal to read rows piped in names standard input, never the temporary spool they
    were read from (gone once the command ends, so a path the operator cannot open), on a
    plain send and with --compose, for a bad line and for a rehearsal that cannot fire."""
    spool = str(own_tempdir(ws, monkeypatch) / "notifier-stdin-")
    bad = ws.invoke("send", "-", input="to,subject\n,Hi\n")
    assert bad.exit_code == 2, bad.output
    assert "standard input (`-`): 1 problem" in bad.output and spool not in bad.output
    (ws.path / "brief.txt").write_text("Say hello.")
    composed = ws.invoke(
        "send", "-", "--compose", "brief.txt", input="to,name\n,Ada\n",
        env={"ANTHROPIC_API_KEY": "sk-test"},
    )  # fmt: skip
    assert composed.exit_code == 2, composed.output
    assert "standard input (`-`): 1 problem" in composed.output and spool not in composed.output
    rehearsal = ws.invoke(
        "send", "-", input="to,subject,body\nada@example.com,Hi,B\n",
        env={"NOTIFIER_CRASH_AT": "after-send:5"},
    )  # fmt: skip
    assert rehearsal.exit_code == 2, rehearsal.output
    assert "standard input (`-`) has 1 item(s)" in rehearsal.output
    assert spool not in rehearsal.output and not ws.has_database()


def test_rows_piped_in_that_cannot_be_spooled_are_exit_2_naming_the_fix(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full temporary directory while `send -` keeps the rows piped in: exit 2 naming
    standard input, the cause and what to do (TMPDIR, or the file's path), never an
    internal error; nothing is stored and no spool is left behind."""
    real_open = Path.open

    def full(self: Path, mode: str = "r", *args: object, **kwargs: object) -> object:
        if self.name == "stdin.csv" and "w" in mode:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(self, mode, *args, **kwargs)  # type: ignore[call-overload]

    tmp = own_tempdir(ws, monkeypatch)
    monkeypatch.setattr(Path, "open", full)
    result = ws.invoke("send", "-", input="to,subject,body\nada@example.com,Hi,B\n")
    monkeypatch.setattr(Path, "open", real_open)
    assert result.exit_code == 2, result.output
    assert "standard input" in result.output and "No space left on device" in result.output
    assert "TMPDIR" in result.output and "internal error" not in result.output
    assert list(tmp.iterdir()) == []
    assert not ws.has_database()
