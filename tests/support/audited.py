"""Runs sent under an audit key, and verify.py's verdict on them, for the tests of the event
chain and replay: a run is sent in-process (notifier.api) through a scripted receiver, and
checked the way `notifier verify` checks it, from a read-only store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from notifier.api import Notifier
from notifier.channels.scripted import Channels, Script, ScriptedChannel, always_deliver
from notifier.config import Config, RetrySettings
from notifier.domain.chain import KEY_ENV, UNKEYED, Signer
from notifier.domain.intent import intent_digest, run_fingerprint
from notifier.domain.replay import Difference
from notifier.domain.verify import RunVerdict, verify
from notifier.engine.runner import RunResult
from notifier.store import Store

from .workspace import Workspace, make_rows

KEY = "the auditors' key"
SIGNER = Signer(KEY.encode())
# The channel the runs go through: a webhook the script answers (never dialled).
HOOKS = {
    "type": "webhook",
    "url": "http://127.0.0.1:9/notifications",
    "idempotent": False,
    "timeout": 0.2,
    "query_delay": 0,
}
TOML = '[channels.hooks]\ntype = "webhook"\nurl = "http://127.0.0.1:9/notifications"\n'


def config() -> Config:
    retry = RetrySettings(max_attempts=3, backoff_base_s=0.01, backoff_max_s=0.05)
    return Config(path=None, channels={"hooks": dict(HOOKS)}, retry=retry)


def keyed(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process writes under KEY (as NOTIFIER_AUDIT_KEY would have it)."""
    monkeypatch.setenv(KEY_ENV, KEY)


def send(
    ws: Workspace,
    run_id: str,
    rows: int,
    script: Script = always_deliver,
    *,
    start: int = 1,
    concurrency: int = 1,
) -> tuple[RunResult, ScriptedChannel]:
    """Send `rows` rows (u{start}…) as `run_id` through a receiver that neither dedupes
    nor can be asked, answering by `script`."""
    batch = ws.write_csv(f"{run_id}.csv", make_rows(rows, start=start))
    channel = ScriptedChannel("hooks", script, idempotent=False, queryable=False)
    notifier = Notifier.open(ws.db, config=config(), channels=Channels(hooks=channel))
    result = notifier.send(Path(batch.name), channel="hooks", run_id=run_id,
                           concurrency=concurrency)  # fmt: skip
    assert isinstance(result, RunResult), result
    return result, channel


def verdict(ws: Workspace, run_id: str, signer: Signer = SIGNER) -> RunVerdict:
    """verify.py's verdict on `run_id`, read from a read-only store as the command reads it."""
    store = Store.open(ws.db, readonly=True, audited=True)
    try:
        (found,) = verify(store.audit, [run_id], signer)
    finally:
        store.close()
    return found


def verdicts(ws: Workspace, signer: Signer = UNKEYED) -> dict[str, RunVerdict]:
    store = Store.open(ws.db, readonly=True, audited=True)
    try:
        return {v.run_id: v for v in verify(store.audit, store.audit.run_ids(), signer)}
    finally:
        store.close()


def named(found: RunVerdict) -> set[tuple[str, str, str, str | None]]:
    """Each finding as (table, row, change, column): what a test expects to be named."""
    return {_key(d) for d in found.findings}


def _key(d: Difference) -> tuple[str, str, str, str | None]:
    return (d.table.value, d.row, d.change.value, d.column)


def rewrite_intent(ws: Workspace, run_id: str, seq: int, *, digest: bool = True) -> str:
    """Send item `seq` of `run_id` elsewhere with other words, as an editor without the key
    would: its target and payload rewritten, and (with `digest`) its digest recomputed to
    match. Returns the digest the item now holds."""
    ((channel, payload, stored),) = ws.query(
        "SELECT channel, payload, intent_digest FROM items WHERE run_id = ? AND seq = ?",
        (run_id, seq),
    )
    target = "mallory@example.net"
    forged = {**json.loads(payload), "to": target, "body": "Pay at mallory.example.net"}
    new_digest = intent_digest(channel, target, forged) if digest else stored
    ws.write(
        "UPDATE items SET target = ?, payload = ?, intent_digest = ? WHERE run_id = ? AND seq = ?",
        (target, json.dumps(forged), new_digest, run_id, seq),
    )
    return str(new_digest)


def stored_fingerprint(ws: Workspace, run_id: str) -> str:
    """The run's fingerprint recomputed from its items' digests as stored now."""
    digests = [d for (d,) in ws.query(
        "SELECT intent_digest FROM items WHERE run_id = ? ORDER BY seq", (run_id,))]  # fmt: skip
    ((snapshot,),) = ws.query("SELECT channel_snapshot FROM runs WHERE run_id = ?", (run_id,))
    return run_fingerprint(digests, json.loads(snapshot))
