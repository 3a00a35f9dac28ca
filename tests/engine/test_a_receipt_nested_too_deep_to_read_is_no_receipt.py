"""An answer's body is read for a receipt only as far as it can be: a JSON document nested
deeper than the parser goes (100 000 `[`, 100 kB, well under the body cap) raises Python's
RecursionError, which is no ValueError. A 2xx to the POST is the receiver's acceptance
whatever its body (the receipt id is read "when it is a string"), so the item is `sent`;
a status query's 200 without a readable receipt proves nothing, and `reconcile` ends with
its message and exit code, never an internal error (exit 1)."""

from __future__ import annotations

import pytest

from ..conftest import Workspace, make_rows
from ..support.scripted_http import Reply, Script, hooks_config, scripted

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(60)]

NESTED = b"[" * 100_000


def test_a_2xx_whose_body_nests_too_deep_is_still_a_delivery(ws: Workspace) -> None:
    """A webhook that can neither dedupe nor be asked answers 201 with a body nested too
    deep: delivered, recorded `sent` (exit 0), never left unknown."""
    script = Script(posts=[Reply(201, NESTED)])
    with scripted(script) as port:
        (ws.path / "notifier.toml").write_text(hooks_config(port, status=False))
        ws.write_csv("batch.csv", make_rows(1))
        sent = ws.invoke("send", "batch.csv", "--channel", "hooks")
    assert ws.ledger.states() == {"u1": "sent"}, sent.output
    assert script.posted == 1
    assert sent.exit_code == 0, sent.output


def test_a_status_200_nested_too_deep_leaves_reconcile_its_exit_code(ws: Workspace) -> None:
    """The POST is answered 504 and the send's query (three tries) 500: unknown. The
    query `reconcile` asks is answered 200 with a body nested too deep: still unknown,
    exit 3, no internal error."""
    failed = Reply(500, b'{"error": "oops"}')
    script = Script(
        posts=[Reply(504, b'{"error": "gateway timeout"}')],
        gets=[failed, failed, failed, Reply(200, NESTED)],
    )
    with scripted(script) as port:
        (ws.path / "notifier.toml").write_text(hooks_config(port, status=True))
        ws.write_csv("batch.csv", make_rows(1))
        sent = ws.invoke("send", "batch.csv", "--channel", "hooks")
        assert ws.ledger.states() == {"u1": "unknown"}, sent.output
        assert script.got == 3
        settled = ws.invoke("reconcile")
    assert script.got > 3
    assert "internal error" not in settled.output
    assert settled.exit_code == 3, settled.output
    assert ws.ledger.states() == {"u1": "unknown"}, settled.output
