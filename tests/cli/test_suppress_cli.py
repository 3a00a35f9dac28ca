"""`notifier suppress add|import|list|remove` through the real CLI, on both engines: what is
stored, what is audited, the list's three formats, and bad input refused whole (exit 2)."""

from __future__ import annotations

import csv
import io
import json

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from notifier.cli.suppress import read_import
from notifier.domain.cells import safe_cell
from notifier.domain.suppression import Entry, address_key, address_problem, reason_problem

from ..conftest import Workspace

pytestmark = pytest.mark.both_stores


def listed(ws: Workspace) -> list[dict[str, str]]:
    result = ws.invoke("suppress", "list", "--format", "json")
    assert result.exit_code == 0, result.output
    rows: list[dict[str, str]] = json.loads(result.output)["suppressions"]
    return rows


def test_add_normalises_and_audits_and_remove_takes_off(ws: Workspace) -> None:
    """`add` stores each address once under its normalised form (Ann@Example.com is
    ann@example.com) with reason, source and operator; adding it again changes nothing;
    `remove` (in any case) takes it off; every change is in the audit with its operator."""
    added = ws.invoke("suppress", "add", "Ann@Example.com", " bob@x.org ", "--reason", "asked",
                      env={"USER": "alice"})  # fmt: skip
    assert added.exit_code == 0, added.output
    again = ws.invoke("suppress", "add", "ann@example.com", env={"USER": "alice"})
    assert again.exit_code == 0 and "1 already on the list" in again.output
    rows = listed(ws)
    assert [(r["address"], r["reason"], r["source"], r["operator"]) for r in rows] == [
        ("ann@example.com", "asked", "operator", "alice"),
        ("bob@x.org", "asked", "operator", "alice"),
    ]
    removed = ws.invoke("suppress", "remove", "ANN@example.COM", "zed@x.org", env={"USER": "bo"})
    assert removed.exit_code == 0, removed.output
    assert "removed 1" in removed.output and "not on it: zed@x.org" in removed.output
    assert [r["address"] for r in listed(ws)] == ["bob@x.org"]
    audit = [
        (operator, *change)
        for operator, change in zip(
            ws.ledger.suppression_operators(), ws.ledger.suppression_audit(), strict=True
        )
    ]
    assert audit == [
        ("alice", "add", "ann@example.com", "operator"),
        ("alice", "add", "bob@x.org", "operator"),
        ("bo", "remove", "ann@example.com", "operator"),
    ]


def test_add_of_something_not_an_address_exits_2_and_stores_nothing(ws: Workspace) -> None:
    """A bad ADDRESS is named in a one-paragraph message with the command that works, exit
    2, and none of the addresses given with it is stored."""
    result = ws.invoke("suppress", "add", "good@example.com", "not-an-address")
    assert result.exit_code == 2
    assert "'not-an-address' is not an e-mail address" in result.output
    assert "notifier suppress add ann@example.com" in result.output
    assert "Traceback" not in result.output
    assert not ws.has_database()  # refused before the database was even created
    assert ws.invoke("suppress", "add", "first@example.com").exit_code == 0
    assert ws.invoke("suppress", "add", "good@example.com", "bad@").exit_code == 2
    assert [r["address"] for r in listed(ws)] == ["first@example.com"]


def test_import_reads_email_and_reason_columns(ws: Workspace) -> None:
    """An import file with an `email` column and a `reason` column: every address stored
    with its reason, source `import`."""
    (ws.path / "bounced.csv").write_text(
        "name,email,reason\nAnn,Ann@Example.com,hard bounce\nCy,cy@example.org,\n"
    )
    result = ws.invoke("suppress", "import", "bounced.csv")
    assert result.exit_code == 0, result.output
    assert "suppressed 2" in result.output
    assert [(r["address"], r["reason"], r["source"]) for r in listed(ws)] == [
        ("ann@example.com", "hard bounce", "import"),
        ("cy@example.org", None, "import"),
    ]


def test_import_without_a_header_reads_the_first_column(ws: Workspace) -> None:
    """A file of bare addresses (no header): the first line is data too."""
    (ws.path / "plain.csv").write_text("a@example.com\nB@example.com\n\n")
    result = ws.invoke("suppress", "import", "plain.csv")
    assert result.exit_code == 0, result.output
    assert [r["address"] for r in listed(ws)] == ["a@example.com", "b@example.com"]


def test_import_of_a_bad_file_exits_2_with_line_numbers_and_stores_nothing(
    ws: Workspace,
) -> None:
    """One bad line among good ones: exit 2 naming every bad line by number, and not one
    address of the file is stored (nor audited)."""
    assert ws.invoke("suppress", "add", "keep@example.com").exit_code == 0
    (ws.path / "bad.csv").write_text(
        "address,reason\nok@example.com,x\nnope,y\nalso ok@example.com,z\nfine@example.com,\n"
    )
    result = ws.invoke("suppress", "import", "bad.csv")
    assert result.exit_code == 2, result.output
    assert "line 3: 'nope'" in result.output and "line 4: 'also ok@example.com'" in result.output
    assert "nothing was stored" in result.output
    assert "Traceback" not in result.output
    assert [r["address"] for r in listed(ws)] == ["keep@example.com"]
    assert len(ws.ledger.suppression_audit()) == 1
    missing = ws.invoke("suppress", "import", "absent.csv")
    assert missing.exit_code == 2 and "absent.csv does not exist" in missing.output


def test_list_formats_table_json_csv_and_csv_reads_back(ws: Workspace) -> None:
    """`list` as a table, as JSON and as CSV; the CSV imports back as the same list."""
    assert ws.invoke("suppress", "add", "a@example.com", "--reason", "=1+1").exit_code == 0
    assert ws.invoke("suppress", "add", "b@example.com").exit_code == 0
    table = ws.invoke("suppress", "list")
    assert table.exit_code == 0
    assert "a@example.com" in table.output and "2 suppressed address(es)" in table.output
    assert [r["address"] for r in listed(ws)] == ["a@example.com", "b@example.com"]
    out = ws.invoke("suppress", "list", "--format", "csv").output
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [(r["address"], r["reason"], r["source"]) for r in rows] == [
        ("a@example.com", "'=1+1", "operator"),  # a spreadsheet shows it as text
        ("b@example.com", "", "operator"),
    ]
    (ws.path / "back.csv").write_text(out)
    assert ws.invoke("suppress", "remove", "a@example.com", "b@example.com").exit_code == 0
    assert listed(ws) == []
    assert ws.invoke("suppress", "import", "back.csv").exit_code == 0
    assert [r["address"] for r in listed(ws)] == ["a@example.com", "b@example.com"]
    assert ws.invoke("suppress", "list", "--format", "xml").exit_code == 2


def test_list_csv_reads_back_exactly_with_formula_like_addresses_and_reasons(
    ws: Workspace,
) -> None:
    """Addresses and reasons that start like a spreadsheet formula (or with an apostrophe)
    are escaped in the CSV, and `import` takes the escape off: the same list comes back,
    never an address with an apostrophe in front (which would leave the real one mailable)."""
    addresses = ["=evil@example.com", "-dash@example.com", "+plus@example.com",
                 "@at@example.com", "'quote@example.com", "plain@example.com"]  # fmt: skip
    added = ws.invoke("suppress", "add", "--reason", "=1+1", "--", *addresses)
    assert added.exit_code == 0, added.output
    before = [(r["address"], r["reason"]) for r in listed(ws)]
    assert sorted(a for a, _ in before) == sorted(addresses)
    out = ws.invoke("suppress", "list", "--format", "csv").output
    assert "'=evil@example.com" in out  # escaped on the way out
    (ws.path / "back.csv").write_text(out)
    assert ws.invoke("suppress", "remove", "--", *addresses).exit_code == 0
    assert listed(ws) == []
    imported = ws.invoke("suppress", "import", "back.csv")
    assert imported.exit_code == 0, imported.output
    assert [(r["address"], r["reason"]) for r in listed(ws)] == before


_LOCAL = st.text(
    alphabet=st.characters(min_codepoint=33, max_codepoint=0x2FF, exclude_characters='@,"'),
    min_size=1,
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(
    start=st.sampled_from(["", "=", "+", "-", "@", "'", "''", "'="]),
    local=_LOCAL,
    domain=st.from_regex(r"[a-z0-9]{1,10}\.[a-z]{2,4}", fullmatch=True),
    reason=st.text(max_size=20),
)
def test_any_address_and_reason_round_trip_through_the_exported_csv(
    tmp_path_factory: pytest.TempPathFactory, start: str, local: str, domain: str, reason: str
) -> None:
    """Whatever an address is, the CSV that `suppress list` writes (each cell through
    report.safe_cell) reads back with `read_import` as the same address and reason."""
    address = f"{start}{local}@{domain}"
    reason = reason.strip()
    # A reason with a control character is refused (a `\r` among them).
    assume(address_problem(address) is None and reason_problem(reason) is None)
    path = tmp_path_factory.mktemp("rt") / "list.csv"
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["address", "reason"])
    writer.writerow([safe_cell(address_key(address)), safe_cell(reason)])
    path.write_text(buffer.getvalue(), encoding="utf-8")
    assert read_import(path) == [Entry(address_key(address), reason or None)]
