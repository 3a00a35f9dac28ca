"""Planning: validated rows become frozen intents (key + digest) under one run."""

from __future__ import annotations

import re
import secrets
from collections import Counter
from dataclasses import dataclass
from typing import Any

from . import clock
from .batch import BatchRow
from .config import Config
from .intent import (
    CONTRACT_VERSION,
    canonical_json,
    content_fingerprint,
    idempotency_key,
    intent_digest,
    make_payload,
    new_key_nonce,
    run_fingerprint,
)
from .state_machine import RunState

RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def new_run_id() -> str:
    """Sortable by creation time, unique without coordination."""
    return "run-" + clock.now().strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


@dataclass(frozen=True)
class Plan:
    run_id: str
    key_nonce: str
    fingerprint: str  # approval fingerprint: digests + channel definitions
    content_fingerprint: str  # "already planned": digests + channel names only
    channel_snapshot: dict[str, dict[str, Any]]
    items: list[dict[str, Any]]
    per_channel: dict[str, int]

    def run_row(self, batch_path: str, options: dict[str, Any]) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "state": RunState.PLANNED.value,
            "created_at": clock.now_iso(),
            "batch_path": batch_path,
            "key_nonce": self.key_nonce,
            "fingerprint": self.fingerprint,
            "content_fingerprint": self.content_fingerprint,
            "channel_snapshot": self.channel_snapshot,
            "options": options,
            "contract_version": CONTRACT_VERSION,
        }


def make_plan(
    rows: list[BatchRow],
    config: Config,
    run_id: str,
    snapshot: dict[str, dict[str, Any]] | None = None,
    nonce: str | None = None,
) -> Plan:
    """`snapshot` and `nonce`: the run's stored channel snapshot and key nonce (a plan frozen
    after drafting uses those taken when the send began, never the file as it is now)."""
    if snapshot is None:
        snapshot = config.snapshot({row.channel for row in rows})
    if nonce is None:
        nonce = new_key_nonce()
    items = []
    for row in rows:
        payload = make_payload(row.subject, row.body, row.data, row.not_after)
        items.append(
            {
                "run_id": run_id,
                "seq": row.seq,
                "item_id": row.item_id,
                "channel": row.channel,
                "target": row.to,
                # Stored as the canonical JSON it is digested as: one encoding, no drift.
                "payload": canonical_json(payload),
                "idempotency_key": idempotency_key(run_id, nonce, row.item_id, row.to),
                "intent_digest": intent_digest(row.channel, row.to, payload),
                "not_after": row.not_after,
            }
        )
    digests = [str(i["intent_digest"]) for i in items]
    return Plan(
        run_id=run_id,
        key_nonce=nonce,
        fingerprint=run_fingerprint(digests, snapshot),
        content_fingerprint=content_fingerprint(digests, snapshot.keys()),
        channel_snapshot=snapshot,
        items=items,
        per_channel=dict(Counter(row.channel for row in rows)),
    )
