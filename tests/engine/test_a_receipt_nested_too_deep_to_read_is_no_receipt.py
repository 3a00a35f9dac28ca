"""An answer's body is read for a receipt only as far as it can be: a JSON document nested
deeper than the parser goes (100 000 `[`, 100 kB, well under the body cap) raises Python's
RecursionError, which is no ValueError. A 2xx to the POST is the receiver's acceptance
whatever its body (the receipt id is read "when it is a string"), so the item is `sent`;
a status query's 200 without a readable receipt proves nothing, and `reconcile` ends with
its message and exit code, never an internal error (exit 1). At N = 1 and at N = 8 with
more rows than senders (claimed ahead where the channel can be asked), of every item."""

from __future__ import annotations

import pytest

from ..conftest import Workspace, make_rows
from ..support.halts import all_unknown_and_asked
from ..support.scripted_http import Reply, Script, hooks_config, scripted

# The pauses between a status query's tries, and the backoffs, at the test switch's scale
# (waits.py): what an answer proves does not depend on how long they are.
pytestmark = [
    pytest.mark.both_stores,
    pytest.mark.timeout(180),  # a bound on a hang, far past a loaded machine's 20 s
    pytest.mark.usefixtures("fast_waits"),
]

NESTED = b"[" * 100_000


@pytest.mark.parametrize("n", [1, 8])
@pytest.mark.parametrize("asked", [False, True], ids=["unasked", "asked"])
def test_a_2xx_whose_body_nests_too_deep_is_still_a_delivery(
    ws: Workspace, n: int, asked: bool
) -> None:
    """A webhook that cannot dedupe answers 201 with a body nested too deep: every item
    delivered once, recorded `sent` (exit 0), never left unknown; where it can be asked (at
    N = 8 items then claimed ahead), none is asked about: a 2xx is no doubt."""
    rows = 1 if n == 1 else 2 * n
    script = Script(posts=[Reply(201, NESTED)])
    with scripted(script) as port:
        (ws.path / "notifier.toml").write_text(hooks_config(port, status=asked))
        ws.write_csv("batch.csv", make_rows(rows))
        sent = ws.invoke("send", "batch.csv", "--channel", "hooks", "--concurrency", str(n))
    assert ws.ledger.states() == {f"u{i}": "sent" for i in range(1, rows + 1)}, sent.output
    assert script.posted_by == dict.fromkeys(ws.ledger.keys(), 1)
    assert script.got == 0, script.got_by
    assert sent.exit_code == 0, sent.output


@pytest.mark.parametrize("n", [1, 8])
def test_a_status_200_nested_too_deep_leaves_reconcile_its_exit_code(ws: Workspace, n: int) -> None:
    """Every item's POST is answered 504 and the send's query of it (three tries) 500:
    unknown. The query `reconcile` asks of each is answered 200 with a body nested too
    deep: every item still unknown, none POSTed again, exit 3, no internal error."""
    rows = 1 if n == 1 else 2 * n
    failed = Reply(500, b'{"error": "oops"}')
    script = Script(
        posts=[Reply(504, b'{"error": "gateway timeout"}')],
        gets=[failed, failed, failed, Reply(200, NESTED)],
    )
    with scripted(script) as port:
        (ws.path / "notifier.toml").write_text(hooks_config(port, status=True))
        asked = all_unknown_and_asked(ws, script.got_by.__getitem__, rows, n)
        keys = list(asked)
        settled = ws.invoke("reconcile")
    # Every item asked again, each answered the 200 nested too deep by now.
    assert all(asked[key] < script.got_by[key] for key in keys), script.got_by
    assert all(script.got_by[key] > 3 for key in keys), script.got_by
    assert script.posted_by == dict.fromkeys(keys, 1)
    assert "internal error" not in settled.output
    assert settled.exit_code == 3, settled.output
    assert set(ws.ledger.states().values()) == {"unknown"}, settled.output
