"""The chain of a run's events: each event's hash covers a canonical form of the event and
the hash of the one before it, so an event deleted, inserted, reordered or edited breaks
every link after it.

With a key (NOTIFIER_AUDIT_KEY, or `[audit] key_file` in notifier.toml) each link is an
HMAC-SHA256 under that key: whoever rewrites a row without the key cannot make the links
that follow it agree. Without one the links are plain SHA-256: they catch accidents (a lost
write, truncation, a bad disk), not an editor, who can compute them as well as we can.
HMAC and not a signature: the standard library has it, it costs a microsecond or two per
event, and the price, that an auditor needs the secret to check it, is stated in
docs/guarantees.md.

Pure: no I/O, no store. The store calls `Signer.link` as it numbers events at COMMIT;
verify.py calls it again to check them. The key never leaves this object: a run records
only its id (`key_id`), which cannot be turned back into the key.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, field
from enum import StrEnum

KEY_ENV = "NOTIFIER_AUDIT_KEY"
# A key id is the head of a SHA-256 over this prefix and the key: a tag that names the key
# in runs.audit_key_id and in messages, never a link of the chain itself.
_KEY_ID_PREFIX = b"notifier-audit-key-id:"
KEY_ID_CHARS = 16


class ChainKind(StrEnum):
    """How a run's events are chained (runs.audit_chain; NULL: written before the chain)."""

    KEYED = "hmac-sha256"
    UNKEYED = "sha256"


def key_id(key: bytes) -> str:
    """The id recorded with a run keyed by `key`: enough to tell two keys apart, nothing to
    recover the key from."""
    return hashlib.sha256(_KEY_ID_PREFIX + key).hexdigest()[:KEY_ID_CHARS]


def canonical(
    prev_hash: str | None,
    run_id: str,
    seq_no: int,
    kind: str,
    item_seq: int | None,
    detail: str | None,
    at: str,
) -> bytes:
    """The bytes a link covers: every field length-prefixed (None written as `-`), so no two
    different events, nor a field's text moved into its neighbour, share a form."""
    parts = (prev_hash, run_id, str(seq_no), kind,
             None if item_seq is None else str(item_seq), detail, at)  # fmt: skip
    # A cell read back holding bytes that are not UTF-8 (a bad disk; kept as surrogates by
    # the audit's reader) is linked as those bytes: its link differs, and it is named.
    text = "".join(["-" if p is None else f"{len(p)}:{p}" for p in parts])
    return text.encode("utf-8", "surrogateescape")


@dataclass(frozen=True)
class Signer:
    """What links a run's events: a key (keyed links), or none (plain SHA-256)."""

    key: bytes | None = field(default=None, repr=False)

    @property
    def kind(self) -> ChainKind:
        return ChainKind.UNKEYED if self.key is None else ChainKind.KEYED

    @property
    def key_id(self) -> str | None:
        return None if self.key is None else key_id(self.key)

    def for_kind(self, kind: ChainKind) -> Signer:
        """The signer for a run chained as `kind`: an unkeyed run stays unkeyed whoever
        writes to it (its links must all be of one kind to be checked)."""
        return UNKEYED if kind is ChainKind.UNKEYED else self

    def link(
        self,
        prev_hash: str | None,
        run_id: str,
        seq_no: int,
        kind: str,
        item_seq: int | None,
        detail: str | None,
        at: str,
    ) -> str:
        """The hash of one event, after `prev_hash` (None for a run's first event)."""
        message = canonical(prev_hash, run_id, seq_no, kind, item_seq, detail, at)
        if self.key is None:
            return hashlib.sha256(message).hexdigest()
        return hmac.digest(self.key, message, "sha256").hex()


UNKEYED = Signer()


def signer_from(env_key: str | None, key_file_text: str | None) -> Signer:
    """The signer of a process: the environment's key first, else the key file's text
    (surrounding whitespace, such as its final line break, is not part of the key)."""
    if env_key:
        return Signer(env_key.encode("utf-8"))
    if key_file_text is not None and key_file_text.strip():
        return Signer(key_file_text.strip().encode("utf-8"))
    return UNKEYED
