"""`suppress import` stores every address of its file or none. A quote opened in one cell and
never closed (a bounce export whose reason quotes a relay's reply) makes every later line
part of that cell: read leniently, the import would say it suppressed the first address and
leave every later one to be mailed. Such a file is refused (exit 2, naming the line where
the quote opened, nothing stored), as is one whose cell is too long for the CSV reader (exit
2, never an internal error); and a bad line after a reason spanning lines is named by its
line in the file, where an editor shows it."""

from __future__ import annotations

import json

import pytest

from ..conftest import Workspace

pytestmark = [pytest.mark.timeout(60), pytest.mark.both_stores]


def listed(ws: Workspace) -> list[str]:
    result = ws.invoke("suppress", "list", "--json")
    assert result.exit_code == 0, result.output
    return [s["address"] for s in json.loads(result.stdout)["suppressions"]]


def test_a_quote_left_open_refuses_the_file_never_swallows_the_lines_after_it(
    ws: Workspace,
) -> None:
    assert ws.invoke("suppress", "add", "keep@example.com").exit_code == 0
    (ws.path / "bounced.csv").write_text(
        "address,reason\n"
        'ann@example.com,"550 5.1.1 <ann@example.com>: user unknown\n'
        "bob@example.com,hard bounce\n"
        "carol@example.com,complained\n"
    )
    result = ws.invoke("suppress", "import", "bounced.csv")
    assert result.exit_code == 2, result.output
    assert "line 2" in result.output and "quote" in result.output
    assert "nothing was stored" in result.output and "Traceback" not in result.output
    # The command that works once the file is mended, with the file: ready to run again.
    assert "suppress import bounced.csv` again" in result.output, result.output
    assert listed(ws) == ["keep@example.com"]


def test_a_cell_too_long_to_read_is_bad_input_never_an_internal_error(ws: Workspace) -> None:
    assert ws.invoke("suppress", "add", "keep@example.com").exit_code == 0
    lines = "".join(f"user{n}@example.com,bounced\n" for n in range(8000))
    (ws.path / "bounced.csv").write_text(
        f'address,reason\nann@example.com,"550 user unknown\n{lines}'
    )
    result = ws.invoke("suppress", "import", "bounced.csv")
    assert result.exit_code == 2, result.output
    assert "line 2" in result.output and "internal error" not in result.output
    assert "nothing was stored" in result.output and "Traceback" not in result.output
    assert listed(ws) == ["keep@example.com"]


def test_a_bad_line_after_a_reason_spanning_lines_is_named_by_its_line_in_the_file(
    ws: Workspace,
) -> None:
    (ws.path / "bounced.csv").write_text(
        'address,reason\nann@example.com,"550 5.1.1\nuser unknown"\nnope,x\n'
    )
    result = ws.invoke("suppress", "import", "bounced.csv")
    assert result.exit_code == 2, result.output
    assert "line 4: 'nope'" in result.output, result.output
    assert "suppress import bounced.csv` again" in result.output, result.output
