"""The suppression list treats the two spellings of an internationalised domain as one
address (`suppression.address_keys`): suppressed as `ann@bücher.example`, a row to
`ann@xn--bcher-kva.example` is suppressed. `suppress remove` must read them as one too:
given either spelling it takes the address off (every entry under any spelling of it), says
so, and the file sent again reaches the row once. Otherwise it says "not on it" while the
address stays suppressed, and the row an operator released is never sent."""

from __future__ import annotations

import pytest

from ..conftest import Workspace

pytestmark = [pytest.mark.timeout(60), pytest.mark.both_stores]

UNICODE = "ann@bücher.example"
PUNYCODE = "ann@xn--bcher-kva.example"


@pytest.mark.parametrize(
    ("added", "removed"),
    [([UNICODE], PUNYCODE), ([PUNYCODE], UNICODE), ([UNICODE, PUNYCODE], UNICODE)],
    ids=["unicode-removed-as-punycode", "punycode-removed-as-unicode", "both-removed-as-one"],
)
def test_remove_in_the_other_spelling_takes_the_address_off(
    ws: Workspace, added: list[str], removed: str
) -> None:
    for address in added:
        assert ws.invoke("suppress", "add", address).exit_code == 0
    batch = ws.write_csv("b.csv", [["to", "subject", "body"], [PUNYCODE, "s", "b"]])
    held = ws.invoke("send", str(batch))
    assert held.exit_code == 0 and "1 suppressed" in held.output, held.output

    result = ws.invoke("suppress", "remove", removed)
    assert result.exit_code == 0, result.output
    assert "not on it" not in result.output and "removed 1" in result.output, result.output
    listed = ws.invoke("suppress", "list", "--format", "csv")
    assert listed.output.strip().splitlines() == ["address,reason,source,operator,created_at"]

    again = ws.invoke("send", str(batch))
    assert again.exit_code == 0, again.output
    assert "completed: 1 sent" in again.output and "1 suppressed" not in again.output, again.output
    assert [d["to"] for d in ws.outbox_documents()] == [PUNYCODE]
