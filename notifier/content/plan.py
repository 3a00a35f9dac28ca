"""Planning: validated rows become frozen intents (key + digest) under one run."""

from __future__ import annotations

import hashlib
import re
import secrets
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from notifier.config import Config
from notifier.content.batch_csv import BatchRow, Problem, Problems
from notifier.domain import clock
from notifier.domain.intent import (
    CONTRACT_VERSION,
    canonical_json,
    digest_of_normalised,
    key_of_normalised,
    new_key_nonce,
    normalise_target,
    payload_json,
    row_digest,
    row_identity,
)
from notifier.domain.state_machine import RunState
from notifier.store import PlanStage

RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def new_run_id() -> str:
    """Sortable by creation time, unique without coordination."""
    return "run-" + clock.now().strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


@dataclass(frozen=True)
class Plan:
    """A validated batch: its fingerprints, and its intents in a PlanStage (nothing stored
    yet). `close()` discards the stage once the plan is stored or shown."""

    run_id: str
    key_nonce: str
    fingerprint: str  # approval fingerprint: digests + channel definitions
    content_fingerprint: str  # "already planned": digests + channel names only
    channel_snapshot: dict[str, dict[str, Any]]
    items: PlanStage
    per_channel: dict[str, int]

    @property
    def count(self) -> int:
        return self.items.count

    def close(self) -> None:
        self.items.close()

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
    rows: Iterable[BatchRow],
    config: Config,
    run_id: str,
    snapshot: dict[str, dict[str, Any]] | None = None,
    nonce: str | None = None,
    *,
    stage: PlanStage | None = None,
    problems: Problems | None = None,
    refuse_identical: bool = False,
    identities: Mapping[int, str] | None = None,
) -> Plan:
    """Compute each row's intent as the rows stream past, into `stage` (a new one if None),
    with both fingerprints hashed incrementally: memory does not grow with the batch.

    `snapshot` and `nonce`: the run's stored channel snapshot and key nonce (a plan frozen
    after drafting uses those taken when the send began, never the file as it is now).
    `problems`: once the stream has noted one, intents are no longer computed (the plan
    will be refused), but the rows are still read so that every problem is listed.
    `refuse_identical`: a row with no `id` whose identity (channel, recipient, content) an
    earlier line has too is a problem of its line: both would be sent, to the same person.
    `identities`: each row's identity by seq, where it is not what the row now holds (a
    composed row keeps its source row's, whatever was drafted: source_identity)."""
    if nonce is None:
        nonce = new_key_nonce()
    stage = stage if stage is not None else PlanStage()
    digests = hashlib.sha256()  # the ordered digests, shared prefix of both fingerprints
    per_channel: Counter[str] = Counter()
    # Bound once: this loop runs once per row, a million times for a million-row batch.
    add, hash_digest = stage.add, digests.update
    try:
        for row in rows:
            if problems:
                continue
            # Stored as the canonical JSON it is digested as: one encoding, no drift.
            payload = payload_json(
                row.subject,
                row.body,
                row.data,
                row.not_after,
                row.unsubscribe_url,
                row.unsubscribe_mailto,
            )
            target = normalise_target(row.to)  # once, for the digest and the key
            digest = digest_of_normalised(row.channel, target, payload)
            hash_digest(digest.encode("ascii") + b"\n")
            per_channel[row.channel] += 1
            key = key_of_normalised(run_id, nonce, row.item_id, target)
            # Its row digest (intent.row_digest): its intent digest unless it has a deadline
            # or a `\r` to leave out or rewrite. A row without an id is identified by it; a
            # row with one is also compared under it where it differs, since an id-less
            # earlier row of its content has it as its identity whatever its deadline
            # (statements.history._keyed).
            compared = None
            if identities is not None:  # a composed row: its source row's identity
                identity = identities[row.seq]
            else:
                own_digest = digest
                if row.not_after is not None or _has_cr(row):
                    own_digest = _row_digest(row, target)
                identity = row_identity(row.item_id if row.own_id else None, own_digest)
                compared = own_digest if row.own_id and own_digest != digest else None
            add(
                row.seq,
                row.item_id,
                row.channel,
                row.to,
                payload,
                key,
                digest,
                row.not_after,
                identity,
                (row.not_before, row.send_window, row.send_tz),
                row.line,
                compared,
            )
        if refuse_identical and problems is not None and not problems:
            problems.extend(
                Problem(
                    line,
                    f"the same channel, recipient and content as line {first}: both would be "
                    "sent. Remove one, give the file an `id` column, or pass "
                    "--allow-duplicates to send every copy",
                )
                for line, first in stage.identical_lines()
            )
    except BaseException:
        stage.close()
        raise
    if snapshot is None:
        snapshot = config.snapshot(set(per_channel))
    return Plan(
        run_id=run_id,
        key_nonce=nonce,
        fingerprint=fingerprint_of(digests, canonical_json(snapshot)),
        content_fingerprint=fingerprint_of(digests, canonical_json(sorted(snapshot))),
        channel_snapshot=snapshot,
        items=stage,
        per_channel=dict(per_channel),
    )


def source_identity(row: BatchRow) -> str:
    """The identity `row` has as a row of its file (make_plan computes the same): a
    composed row keeps it whatever is drafted for it, so the same row of the same file is
    the same notification whether it was sent as written or composed."""
    return row_identity(row.item_id if row.own_id else None, source_digest(row))


def source_digest(row: BatchRow) -> str:
    """The row digest of `row` as its file gives it (channel, recipient, content): its
    identity without an `id` column. Kept with a composed row's draft (drafts.source_digest),
    since the row's item has its drafted text's digest."""
    return _row_digest(row, normalise_target(row.to))


def _row_digest(row: BatchRow, normalised_target: str) -> str:
    return row_digest(
        row.channel, normalised_target, row.subject, row.body, row.data,
        row.unsubscribe_url, row.unsubscribe_mailto,
    )  # fmt: skip


def _has_cr(row: BatchRow) -> bool:
    """Whether a line break of `row` is written with `\r` (intent.row_digest rewrites it)."""
    return "\r" in row.subject or "\r" in row.body or any("\r" in v for v in row.data.values())


def fingerprint_of(digests: hashlib._Hash, tail: str) -> str:
    """`sha256:` over the ordered digests (a running hash, copied) and then `tail`: the same
    bytes intent.run_fingerprint and intent.content_fingerprint hash, without a list."""
    h = digests.copy()
    h.update(tail.encode("utf-8"))
    return "sha256:" + h.hexdigest()
