"""What a webhook receiver says is quoted into an item's error (a 4xx body, the digest a
conflicting receipt names) or kept as its receipt id, and shown by `send`, `report` and
`status` in the operator's terminal: literally, never acted on. A receiver that put escape
sequences in its answer (`ESC[1A ESC[2K` to rewrite the line above, OSC 52 to write the
operator's clipboard) had them printed raw: its control characters are replaced where the
answer is read, as a relay's reply is."""

from __future__ import annotations

import json

import pytest

from ..conftest import Workspace, make_rows
from ..support.scripted_http import Reply, Script, hooks_config, scripted

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(60)]

ESCAPES = "\x1b[1A\x1b[2Krun: completed \x1b]52;c;ZWNobyBoaQ==\x07"


def _outputs(ws: Workspace, sent: str) -> dict[str, str]:
    outputs = {"send": sent}
    for args in (["report"], ["status"], ["report", "--format", "csv"]):
        outputs[" ".join(args)] = ws.invoke(*args).output
    return outputs


def _raw(outputs: dict[str, str]) -> dict[str, str]:
    return {name: text for name, text in outputs.items() if "\x1b" in text or "\x07" in text}


def test_escape_sequences_in_a_rejection_reach_no_output(ws: Workspace) -> None:
    script = Script(posts=[Reply(400, f"invalid {ESCAPES} recipient".encode())])
    with scripted(script) as port:
        (ws.path / "notifier.toml").write_text(hooks_config(port, status=False))
        ws.write_csv("batch.csv", make_rows(1))
        sent = ws.invoke("send", "batch.csv", "--channel", "hooks")
    assert sent.exit_code == 3, sent.output
    outputs = _outputs(ws, sent.output)
    assert "recipient" in outputs["report"]  # the answer is still quoted
    assert _raw(outputs) == {}


@pytest.mark.parametrize("field", ["id", "intent_digest"])
def test_escape_sequences_in_a_receipt_reach_no_output(ws: Workspace, field: str) -> None:
    """A receipt whose id (kept, and listed) or intent_digest (not ours: a conflict, quoted)
    holds escape sequences."""
    receipt = {"id": "r-1", field: f"x{ESCAPES}y"}
    script = Script(posts=[Reply(200, json.dumps(receipt).encode())])
    with scripted(script) as port:
        (ws.path / "notifier.toml").write_text(hooks_config(port, status=False))
        ws.write_csv("batch.csv", make_rows(1))
        sent = ws.invoke("send", "batch.csv", "--channel", "hooks")
    assert "Traceback" not in sent.output
    outputs = _outputs(ws, sent.output)
    stored = " ".join(
        str(v) for row in ws.query("SELECT receipt_id, last_error FROM items") for v in row
    )
    assert "\x1b" not in stored and "\x07" not in stored, stored
    assert _raw(outputs) == {}
