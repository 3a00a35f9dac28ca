"""The embedded default channel: one JSON file per notification under `outbox/`.

Idempotent and queryable by construction: the file is named by the idempotency key, written
atomically (temp file, fsync, rename, fsync of the directory), and holds the intent digest.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from notifier.channels import options as o
from notifier.channels.base import Capabilities, Ready, always, go_ahead
from notifier.domain import clock
from notifier.domain.answers import ChannelError, ErrorKind, Receipt
from notifier.domain.intent import Intent

SCHEMA = o.Schema(
    {
        "dir": o.Option("str", default="outbox"),
        "rate": o.RATE,
        "window": o.WINDOW,
        "domain_rates": o.DOMAIN_RATES,
    }
)
# Thread-safe: one file per key, written under a unique temp name.
CAPABILITIES = Capabilities(idempotent=True, queryable=True, thread_safe=True)


def capabilities(definition: Mapping[str, Any]) -> Capabilities:
    return CAPABILITIES


def build(name: str, definition: Mapping[str, Any], base_dir: Path) -> OutboxChannel:
    return OutboxChannel(name, base_dir / str(definition.get("dir") or "outbox"))


class OutboxChannel:
    def __init__(self, name: str, directory: Path) -> None:
        self.name = name
        self.idempotent, self.queryable, self.thread_safe = CAPABILITIES
        # A file written whole or not at all, and read back at once: no window.
        self.timeout_s = self.query_delay_s = 0.0
        self.suppress_on_reject = False  # no relay to reject a recipient
        self.max_in_flight: int | None = None  # as many as the run's senders
        self.directory = directory

    def _path(self, key: str) -> Path:
        return self.directory / f"{key}.json"

    def send(self, intent: Intent, ready: Ready = always) -> Receipt:
        existing = self.query(intent.idempotency_key)
        if existing is not None:
            if existing.intent_digest != intent.intent_digest:
                raise ChannelError(
                    ErrorKind.CONFLICT,
                    f"outbox already holds {intent.idempotency_key} with another digest",
                )
            return Receipt(existing.receipt_id, existing.intent_digest, replayed=True)
        document: dict[str, object] = {
            "idempotency_key": intent.idempotency_key,
            "intent_digest": intent.intent_digest,
            "run_id": intent.run_id,
            "item_id": intent.item_id,
            "channel": intent.channel,
            "to": intent.target,
            "subject": intent.subject,
            "body": intent.body,
            "data": dict(intent.data),
            "written_at": clock.now_iso(),
        }
        go_ahead(ready)
        try:
            self._write_atomically(self._path(intent.idempotency_key), document)
        except OSError as exc:
            # Nothing is visible until the rename, and a failed rename leaves nothing behind.
            raise ChannelError(ErrorKind.NOT_SENT, f"outbox write failed: {exc}") from exc
        return Receipt(f"outbox:{intent.idempotency_key}", intent.intent_digest)

    def query(self, key: str) -> Receipt | None:
        path = self._path(key)
        try:
            document = json.loads(path.read_text("utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise ChannelError(ErrorKind.UNCERTAIN, f"cannot read {path}: {exc}") from exc
        return Receipt(f"outbox:{key}", document.get("intent_digest"))

    def close(self) -> None:
        pass

    def _write_atomically(self, path: Path, document: dict[str, object]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        # Not named *.json: a process killed mid-write (other sends are in flight when one
        # crashes) leaves this file behind, and whoever reads the outbox must not see it.
        fd, temp = tempfile.mkstemp(prefix=".tmp-", suffix=".part", dir=self.directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(document, handle, ensure_ascii=False, indent=2, sort_keys=True)
                handle.flush()
                os.fsync(handle.fileno())
            os.rename(temp, path)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise
        directory = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(directory)  # the rename itself must survive power loss
        finally:
            os.close(directory)
