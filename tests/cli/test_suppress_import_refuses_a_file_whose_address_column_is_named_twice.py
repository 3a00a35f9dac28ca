"""A suppression import file naming its address column twice (`email,Email`, as a merged
export or a pasted column makes it) holds addresses in a column the import would never read:
each of those recipients, who asked not to be mailed, would still be mailed while the import
said it succeeded. As `send` refuses duplicate header names, the import is refused whole
(exit 2, naming the column, nothing stored)."""

from __future__ import annotations

import json

import pytest

from ..conftest import Workspace

pytestmark = [pytest.mark.timeout(60), pytest.mark.both_stores]


@pytest.mark.parametrize("header", ["email,Email", "address,address", "address,reason,Address"])
def test_an_import_naming_its_address_column_twice_is_refused_whole(
    ws: Workspace, header: str
) -> None:
    assert ws.invoke("suppress", "add", "keep@example.com").exit_code == 0
    names = header.split(",")
    row = ["first@example.com" if n.lower() != "reason" else "bounced" for n in names]
    row[len(names) - 1 - names[::-1].index(names[-1])] = "second@example.com"
    (ws.path / "bounced.csv").write_text(f"{header}\n{','.join(row)}\n")
    result = ws.invoke("suppress", "import", "bounced.csv")
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and "nothing was stored" in result.output
    assert names[-1] in result.output or names[0] in result.output
    listed = ws.invoke("suppress", "list", "--json")
    addresses = [s["address"] for s in json.loads(listed.stdout)["suppressions"]]
    assert addresses == ["keep@example.com"], addresses
