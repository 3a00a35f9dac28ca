"""A row's `to` holding a character nobody sees (a byte-order mark left mid-file where two
exports were joined, a zero-width space or a soft hyphen pasted with the address, a
no-break space) names another mailbox than the one its writer reads: the suppression list,
which keys `bob@example.com`, would not know it, and a relay would be given the literal
characters. The file is refused (exit 2), the line and the character named, nothing stored
or sent, as for a control character."""

from __future__ import annotations

import pytest

from ..conftest import Workspace

pytestmark = [pytest.mark.timeout(30), pytest.mark.both_stores]


@pytest.mark.parametrize("hidden", ["\ufeff", "\u200b", "\u00ad", "\u00a0", "\u2060"])
def test_a_to_with_an_invisible_character_fails_the_file_naming_it(
    ws: Workspace, hidden: str
) -> None:
    (ws.path / "notifier.toml").write_text('[channels.files]\ntype = "outbox"\n')
    assert ws.invoke("suppress", "add", "bob@example.com").exit_code == 0
    rows = [["to", "subject", "body"], ["ann@example.com", "Hi", "B"]]
    to = f"{hidden}bob@example.com" if hidden == "\ufeff" else f"bob@exam{hidden}ple.com"
    rows.append([to, "Hi", "B"])
    ws.write_csv("b.csv", rows)
    refused = ws.invoke("send", "b.csv", "--channel", "files")
    assert refused.exit_code == 2, refused.output
    assert "line 3" in refused.output and f"U+{ord(hidden):04X}" in refused.output, refused.output
    assert ws.outbox_documents() == []
    assert ws.ledger.runs() == []
