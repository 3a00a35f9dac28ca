"""What a receiver says in a receipt's `intent_digest` is its word, quoted into the
conflict it makes (a digest not ours: another intent holds the key). Like every other
extract of an answer it is masked (a receiver quoting the signing secret it expected) and
bounded (an error extract keeps 200 characters of an answer; a 2xx body may be 1 MiB): it
reaches neither the database nor any output whole. Of every item, at N = 1 and at N = 8
with more rows than senders (the channel can be asked: items claimed ahead); each conflict
halts the run, and the rows it left unsent are resumed until every row was answered."""

from __future__ import annotations

import json

import pytest

from ..conftest import Workspace
from ..support.halts import claimed_ahead, send_through_halts
from ..support.scripted_http import Reply, Script, hooks_config, scripted

# The pauses between a status query's tries, and the backoffs, at the test switch's scale
# (waits.py): what an answer proves does not depend on how long they are.
pytestmark = [
    pytest.mark.both_stores,
    pytest.mark.timeout(180),  # a bound on a hang, far past a loaded machine's 20 s
    pytest.mark.usefixtures("fast_waits"),
]

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
KEY_HEAD = "MfKQ9r8GKYqr"


def _configure(ws: Workspace, port: int) -> None:
    config = hooks_config(port, status=True, idempotent=True)
    config = config.replace('type = "webhook"', 'type = "webhook"\nsecret_env = "HOOKS_SECRET"')
    (ws.path / "notifier.toml").write_text(config)


def _outputs(ws: Workspace, *more: str) -> list[str]:
    return [*more, ws.invoke("report", "--format", "json").output,
            ws.invoke("status", "--json").output]  # fmt: skip


@pytest.mark.parametrize("n", [1, 8])
def test_a_secret_a_receipt_quotes_as_its_digest_is_masked(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch, n: int
) -> None:
    monkeypatch.setenv("HOOKS_SECRET", SECRET)
    rows = 1 if n == 1 else 2 * n
    said = json.dumps({"id": "r1", "intent_digest": f"expected a signature by {SECRET}"})
    script = Script(posts=[Reply(200, said.encode())])
    with scripted(script) as port:
        _configure(ws, port)
        results = send_through_halts(ws, rows, n, "hooks")
    outputs = [r.output for r in results]
    assert [r.exit_code for r in results] == [4] * len(results), outputs  # conflicts
    assert claimed_ahead(ws) == (n > 1)
    assert ws.ledger.states() == {f"u{i}": "failed" for i in range(1, rows + 1)}, outputs
    assert script.posted_by == dict.fromkeys(ws.ledger.keys(), 1)
    assert [text for text in _outputs(ws, *outputs) if KEY_HEAD in text] == []
    assert KEY_HEAD.encode() not in ws.stored_bytes()


@pytest.mark.parametrize("n", [1, 8])
def test_a_digest_of_half_a_megabyte_is_kept_as_an_extract(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch, n: int
) -> None:
    monkeypatch.setenv("HOOKS_SECRET", SECRET)
    rows = 1 if n == 1 else 2 * n
    huge = "sha256:" + "f" * 500_000
    said = json.dumps({"id": "r1", "intent_digest": huge})
    script = Script(posts=[Reply(200, said.encode())])
    with scripted(script) as port:
        _configure(ws, port)
        results = send_through_halts(ws, rows, n, "hooks")
    outputs = [r.output for r in results]
    assert [r.exit_code for r in results] == [4] * len(results), outputs
    assert script.posted_by == dict.fromkeys(ws.ledger.keys(), 1)
    items = ws.ledger.items()
    assert [i.state for i in items] == ["failed"] * rows, outputs
    assert max(len(i.last_error or "") for i in items) < 2_000, [i.last_error for i in items]
    assert max(len(text) for text in _outputs(ws, *outputs)) < 20_000
