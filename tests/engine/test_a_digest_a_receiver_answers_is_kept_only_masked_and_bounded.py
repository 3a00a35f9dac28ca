"""What a receiver says in a receipt's `intent_digest` is its word, quoted into the
conflict it makes (a digest not ours: another intent holds the key). Like every other
extract of an answer it is masked (a receiver quoting the signing secret it expected) and
bounded (an error extract keeps 200 characters of an answer; a 2xx body may be 1 MiB): it
reaches neither the database nor any output whole."""

from __future__ import annotations

import json

import pytest

from ..conftest import Workspace, make_rows
from ..support.scripted_http import Reply, Script, hooks_config, scripted

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(60)]

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
KEY_HEAD = "MfKQ9r8GKYqr"


def _configure(ws: Workspace, port: int) -> None:
    config = hooks_config(port, status=False, idempotent=True)
    config = config.replace('type = "webhook"', 'type = "webhook"\nsecret_env = "HOOKS_SECRET"')
    (ws.path / "notifier.toml").write_text(config)


def _outputs(ws: Workspace, *more: str) -> list[str]:
    return [*more, ws.invoke("report", "--format", "json").output,
            ws.invoke("status", "--json").output]  # fmt: skip


def test_a_secret_a_receipt_quotes_as_its_digest_is_masked(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOOKS_SECRET", SECRET)
    said = json.dumps({"id": "r1", "intent_digest": f"expected a signature by {SECRET}"})
    with scripted(Script(posts=[Reply(200, said.encode())])) as port:
        _configure(ws, port)
        ws.write_csv("batch.csv", make_rows(1))
        sent = ws.invoke("send", "batch.csv", "--channel", "hooks")
    assert sent.exit_code == 4, sent.output  # a conflict
    assert [text for text in _outputs(ws, sent.output) if KEY_HEAD in text] == []
    assert KEY_HEAD.encode() not in ws.stored_bytes()


def test_a_digest_of_half_a_megabyte_is_kept_as_an_extract(ws: Workspace) -> None:
    huge = "sha256:" + "f" * 500_000
    said = json.dumps({"id": "r1", "intent_digest": huge})
    with scripted(Script(posts=[Reply(200, said.encode())])) as port:
        _configure(ws, port)
        ws.write_csv("batch.csv", make_rows(1))
        sent = ws.invoke("send", "batch.csv", "--channel", "hooks", env={"HOOKS_SECRET": SECRET})
    assert sent.exit_code == 4, sent.output
    [item] = ws.ledger.items()
    assert item.state == "failed"
    assert len(item.last_error or "") < 2_000, len(item.last_error or "")
    assert max(len(text) for text in _outputs(ws, sent.output)) < 20_000
