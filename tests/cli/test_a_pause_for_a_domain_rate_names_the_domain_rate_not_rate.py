"""A run that pauses because a recipient domain's rate (`domain_rates`) allows its next send
only after --max-wait says so: its message and stop reason name that domain's rate, never
"--rate", which the operator did not give and which holds nothing back. Both stores."""

from __future__ import annotations

import pytest

from ..conftest import Workspace, make_rows

pytestmark = [pytest.mark.timeout(60), pytest.mark.both_stores]


@pytest.mark.parametrize("concurrency", [1, 8])
def test_a_pause_for_a_domain_rate_names_the_domain_rate_not_rate(
    ws: Workspace, concurrency: int
) -> None:
    """`"example.com" = 0.001` (one send every 1000 s), no `rate`, no --rate: the first row
    goes, the second waits past --max-wait 5, so the run pauses (exit 3) saying that the
    rate of its channel's sends to example.com holds it back."""
    (ws.path / "notifier.toml").write_text(
        '[channels.box]\ntype = "outbox"\ndomain_rates = { "example.com" = 0.001 }\n'
    )
    batch = ws.write_csv("b.csv", make_rows(2))
    result = ws.invoke(
        "send", str(batch), "--channel", "box", "--max-wait", "5",
        "--concurrency", str(concurrency),
    )  # fmt: skip
    assert result.exit_code == 3, result.output
    assert len(ws.outbox_documents()) == 1
    said = result.output
    reason = str(ws.ledger.run().stop_reason)
    for text in (said, reason):
        assert "--rate" not in text, text
        assert "example.com" in text and "domain_rates" in text, text
    assert "internal error" not in said and "Traceback" not in said
