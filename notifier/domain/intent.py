"""Frozen intents: the normalised payload, its idempotency key and its digest.

An intent is what a row *means* once it has been validated: who receives what, on which
channel. The digest identifies that meaning; the key identifies the delivery slot in a run.
Both are computed once at planning time and stored; nothing recomputes them on resume.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import unicodedata
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

CONTRACT_VERSION = "v1"
KEY_PREFIX = "ntf1-"
# 40 hex characters = 160 bits of SHA-256: no collision across any realistic ledger, and the
# whole key (45 characters) stays well under the 64-character limit providers impose.
KEY_HEX_CHARS = 40
# 8 random bytes (16 hex characters) per run: a collision between two runs that also share
# a run id is out of reach.
KEY_NONCE_BYTES = 8


def nfc(value: str) -> str:
    """The NFC form, so that visually identical text always digests the same."""
    return unicodedata.normalize("NFC", value)


def invisible_character(text: str) -> str | None:
    """The first character of `text` nobody sees, or None: a format character (a byte-order
    mark, a zero-width space, a soft hyphen), a space or separator other than U+0020, a
    control. In an address it names another mailbox than the one its writer reads. (Not
    every character outside Python's Unicode tables: a newer script's letters are seen.)"""
    return next((c for c in text if c != " " and unicodedata.category(c) in _UNSEEN), None)


_UNSEEN = frozenset({"Cc", "Cf", "Zs", "Zl", "Zp"})


def normalise_target(target: str) -> str:
    """Trim a recipient and lower-case the domain of an e-mail address (the local part is
    case-sensitive by the RFC, so it is left alone)."""
    value = nfc(target).strip()
    local, at, domain = value.rpartition("@")
    if at and local and domain and "://" not in value:
        return f"{local}@{domain.lower()}"
    return value


# Built once: json.dumps with these options builds a new encoder on every call, and planning
# a million rows calls it millions of times.
_encode = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode
# One JSON string, quoted and escaped exactly as _encode writes strings (ensure_ascii=False).
_quote: Callable[[str], str] = json.encoder.encode_basestring


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, UTF-8 text, NFC strings: one byte string per meaning.

    NFC is applied once to the whole document: JSON's own punctuation is ASCII and never
    composes with a neighbouring mark, so this equals normalising every string inside."""
    return nfc(_encode(value))


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def intent_digest(channel: str, target: str, payload: Mapping[str, Any]) -> str:
    """`sha256:<hex>` over the canonical JSON of everything that would leave the process:
    {"channel", "contract_version", "payload", "target"}."""
    return digest_of_normalised(channel, normalise_target(target), canonical_json(payload))


def digest_of_normalised(channel: str, normalised_target: str, payload_json: str) -> str:
    """`intent_digest` from the payload's canonical JSON, which planning makes anyway (it is
    what gets stored), for a target already through normalise_target (planning normalises
    each recipient once, for the digest and the key). The document's keys sort as channel,
    contract_version, payload, target, so the payload's text is spliced in rather than
    encoded a second time. NFC over the spliced whole equals NFC over the whole encoded at
    once: normalisation depends only on canonical equivalence, which concatenation keeps."""
    body = nfc(
        f'{{"channel":{_quote(channel)},"contract_version":{_quote(CONTRACT_VERSION)},'
        f'"payload":{payload_json},"target":{_quote(normalised_target)}}}'
    )
    return "sha256:" + sha256_hex(body)


def payload_json(
    subject: str,
    body: str,
    data: Mapping[str, str],
    not_after: str | None = None,
    unsubscribe_url: str | None = None,
    unsubscribe_mailto: str | None = None,
) -> str:
    """canonical_json(make_payload(...)), written out directly: planning makes one per row,
    and the general encoder costs twice as much for this fixed shape. Keys in sorted order:
    body, data (its own keys sorted), not_after, subject, unsubscribe_mailto,
    unsubscribe_url (the optional ones only when present)."""
    fields = ",".join(f"{_quote(name)}:{_quote(data[name])}" for name in sorted(data))
    deadline = "" if not_after is None else f',"not_after":{_quote(not_after)}'
    tail = ""
    if unsubscribe_mailto is not None:
        tail += f',"unsubscribe_mailto":{_quote(unsubscribe_mailto)}'
    if unsubscribe_url is not None:
        tail += f',"unsubscribe_url":{_quote(unsubscribe_url)}'
    return nfc(
        f'{{"body":{_quote(body)},"data":{{{fields}}}{deadline},"subject":{_quote(subject)}{tail}}}'
    )


# One-click unsubscribe (RFC 8058, RFC 2369): what a row's `unsubscribe_url` and
# `unsubscribe_mailto` may hold. Each goes into a List-Unsubscribe header between angle
# brackets, on a line of at most 998 characters (RFC 5322), so: URI characters only
# (RFC 3986; anything else percent-encoded), and a bounded length.
UNSUBSCRIBE_MAX_CHARS = 900
_URI_CHARS = re.compile(r"^[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=%]+$")
_MAILTO_ADDRESS = re.compile(r"^[^@\s<>,;\"?/]+@[^@\s<>,;\"?/]+\.[^@\s<>,;\"?/]+$")


def unsubscribe_url(text: str) -> str:
    """The https URL as it is digested and sent; ValueError saying why it cannot be one."""
    value = text.strip()
    if len(value) > UNSUBSCRIBE_MAX_CHARS:
        raise ValueError(f"is longer than {UNSUBSCRIBE_MAX_CHARS} characters")
    if not _URI_CHARS.match(value):
        raise ValueError(
            "holds a space or a character a URL may not carry as it is: percent-encode it"
        )
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError as exc:
        raise ValueError(f"is not a URL ({exc})") from exc
    if parts.scheme.lower() != "https" or not parts.hostname or "." not in parts.hostname:
        raise ValueError(
            "must be an https:// URL with a host (RFC 8058 one-click needs https), e.g. "
            "https://example.com/unsubscribe?u=123"
        )
    return "https" + value[len(parts.scheme) :]


def unsubscribe_mailto(text: str) -> str:
    """`unsub@example.com` or `mailto:unsub@example.com?subject=…` as the mailto: URI that
    is digested and sent; ValueError saying why it cannot be one."""
    value = text.strip()
    value = "mailto:" + (value[7:] if value[:7].lower() == "mailto:" else value)
    if len(value) > UNSUBSCRIBE_MAX_CHARS:
        raise ValueError(f"is longer than {UNSUBSCRIBE_MAX_CHARS} characters")
    address = value[7:].partition("?")[0]
    if not _URI_CHARS.match(value) or not _MAILTO_ADDRESS.match(address):
        raise ValueError(
            "must be an ASCII e-mail address or mailto: URI, e.g. unsubscribe@example.com "
            "or mailto:unsubscribe@example.com?subject=unsubscribe (percent-encode anything "
            "else)"
        )
    return value


def new_key_nonce() -> str:
    """Made once per planned run and stored beside it. Part of every key of the run, so no
    two planned intents ever share a key: not two runs given the same `--run-id` in two
    databases, not a run re-planned after its database was lost."""
    return secrets.token_hex(KEY_NONCE_BYTES)


def idempotency_key(run_id: str, nonce: str, item_id: str, target: str) -> str:
    """A printable-ASCII key that names the delivery slot without carrying personal data:
    it travels to third parties as a header, so only a hash of the components goes out."""
    return key_of_normalised(run_id, nonce, item_id, normalise_target(target))


def key_of_normalised(run_id: str, nonce: str, item_id: str, normalised_target: str) -> str:
    """`idempotency_key` for a target already through normalise_target."""
    # canonical_json of the list, written out: one key per planned row.
    parts = (run_id, nonce, item_id, normalised_target, CONTRACT_VERSION)
    components = nfc("[" + ",".join(map(_quote, parts)) + "]")
    return KEY_PREFIX + sha256_hex(components)[:KEY_HEX_CHARS]


def row_identity(own_id: str | None, digest: str) -> str:
    """What makes two rows of two runs the same notification, with the channel beside it
    (items.channel, items.identity): the row's own `id` when the file has an id column, else
    its row digest (row_digest: its channel, normalised recipient and content). Not the line
    number a missing id stands in for: inserting a row would shift every one below. The id
    in NFC: written composed or decomposed (as some tools save text), it looks the same to
    whoever wrote it, so it is the same row. m006 back-fills the two formulas in SQL (the id
    as written), m019 brings those ids to NFC and m021 the digests to row digests; they must
    stay identical."""
    return digest if own_id is None else "id:" + nfc(own_id)


def row_digest(
    channel: str,
    normalised_target: str,
    subject: str,
    body: str,
    data: Mapping[str, str],
    unsubscribe_url: str | None = None,
    unsubscribe_mailto: str | None = None,
) -> str:
    """What identifies a row without an `id` (row_identity): the intent digest of what it
    says, to whom, through which channel, but without its deadline (when it may still go
    is not what it says: the same file sent again with a later `--not-after` is the same
    notifications) and with its line breaks written `\n` (`\r\n` and `\r` are how another
    editor saves the same text). For a row with neither, exactly its intent digest."""
    payload = payload_json(
        one_line_break(subject),
        one_line_break(body),
        {name: one_line_break(value) for name, value in data.items()},
        None,
        unsubscribe_url,
        unsubscribe_mailto,
    )
    return digest_of_normalised(channel, normalised_target, payload)


def stored_row_digest(channel: str, target: str, payload: str) -> str:
    """row_digest of an item as stored: its recipient as written, its payload's JSON."""
    fields = json.loads(payload)
    return row_digest(
        channel,
        normalise_target(target),
        fields["subject"],
        fields["body"],
        fields["data"],
        fields.get("unsubscribe_url"),
        fields.get("unsubscribe_mailto"),
    )


def one_line_break(text: str) -> str:
    """`text` with every `\r\n` and lone `\r` written `\n`."""
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text


def content_fingerprint(digests: Iterable[str], channel_names: Iterable[str]) -> str:
    """What decides "this batch was already planned": what is sent, to whom, through which
    named channels. Transport tuning (timeouts, retry settings, URLs) is left out on
    purpose: changing a timeout must not make the same batch look new.
    m002 back-fills old runs with the same formula; the two must stay identical."""
    h = hashlib.sha256()
    for digest in digests:
        h.update(digest.encode("ascii"))
        h.update(b"\n")
    h.update(canonical_json(sorted(set(channel_names))).encode("utf-8"))
    return "sha256:" + h.hexdigest()


def run_fingerprint(digests: Iterable[str], channel_snapshot: Mapping[str, Any]) -> str:
    """The approval fingerprint: the ordered intent digests plus the channel definitions
    they will travel through, so an approval covers exactly where things go. It is what
    `runs.fingerprint` holds; "already planned" is decided by `content_fingerprint`."""
    fingerprint = Fingerprinting()
    for digest in digests:
        fingerprint.add(digest)
    return fingerprint.result(channel_snapshot)


class Fingerprinting:
    """run_fingerprint fed a digest at a time, in order: verify hashes a million items'
    digests as it reads them, a slice at a time, without holding them."""

    def __init__(self) -> None:
        self._hash = hashlib.sha256()

    def add(self, digest: str) -> None:
        # utf-8: the same bytes as ascii for every digest written, and no error for one an
        # editor wrote (verify hashes what is stored, whatever it is).
        self._hash.update(digest.encode("utf-8"))
        self._hash.update(b"\n")

    def result(self, channel_snapshot: Mapping[str, Any]) -> str:
        h = self._hash.copy()
        h.update(canonical_json(channel_snapshot).encode("utf-8"))
        return "sha256:" + h.hexdigest()


class Identities:
    """What names each of a run's items, fed in seq order: its row id and its idempotency
    key (the key is what a receiver dedupes by, the id what every report calls the row).
    Chained when the items are stored (the plan, a composed run's freeze), so that verify
    finds either rewritten, or two rows' ids swapped; neither is part of an intent digest."""

    def __init__(self) -> None:
        self._hash = hashlib.sha256()

    def add(self, item_id: str, key: str) -> None:
        # Length-prefixed, as the chain's fields are: no id's text moves into its key.
        for text in (item_id, key):
            # surrogateescape: text read back that was not UTF-8 (no notifier writes it)
            # hashes as its own bytes, never as an error.
            data = text.encode("utf-8", "surrogateescape")
            self._hash.update(b"%d:" % len(data) + data)

    def result(self) -> str:
        return "sha256:" + self._hash.hexdigest()


class Schedules:
    """When each of a run's items may be sent, fed in seq order: its start time as planned
    (items.not_before), its send window and the zone that window is read in. None of them is
    part of an intent digest (content/schedule.py: an approval covers what is sent, not
    when), yet each decides when the engine sends: chained when the items are stored (the
    plan, a composed run's freeze), so that verify finds one rewritten. Each column is
    hashed on its own, so that verify says which."""

    COLUMNS = ("not_before", "send_window", "send_tz")

    def __init__(self) -> None:
        self._hashes = tuple(hashlib.sha256() for _ in self.COLUMNS)

    def add(self, not_before: str | None, send_window: str | None, send_tz: str | None) -> None:
        for digest, value in zip(self._hashes, (not_before, send_window, send_tz), strict=True):
            if value is None:
                digest.update(b"-")  # no length prefix begins so: NULL is not any text
            else:
                data = value.encode("utf-8", "surrogateescape")  # as Identities
                digest.update(b"%d:" % len(data) + data)

    def result(self) -> dict[str, str]:
        return {
            column: "sha256:" + digest.hexdigest()
            for column, digest in zip(self.COLUMNS, self._hashes, strict=True)
        }


def draft_digest(subject: str | None, body: str | None) -> str:
    """What a --compose row's draft says, chained when it is stored: verify and the freeze
    find a draft rewritten after the model wrote it."""
    return "sha256:" + sha256_hex(canonical_json([subject, body]))


class DraftingInputs:
    """What a --compose run's intents are made of besides its drafts: each row's source (fed
    in seq order, a slice at a time), the run's options that shape a draft or a payload (the
    brief, the columns sent to the model, the template; not the model, which `resume
    --model` may change), the channel snapshot and the key nonce. Chained at the plan;
    verify and the freeze find any of them rewritten while the run drafts."""

    def __init__(self) -> None:
        self._sources = hashlib.sha256()

    def add(self, source: str) -> None:
        self._sources.update(source.encode("utf-8"))
        self._sources.update(b"\n")

    def result(self, options: Any, channel_snapshot: Any, key_nonce: str | None) -> str:
        """The digest, with the run's `options` (as stored: anything, if rewritten)."""
        shaping: Any = options
        if isinstance(options, Mapping):
            compose = options.get("compose")
            if isinstance(compose, Mapping):
                compose = {k: v for k, v in compose.items() if k != "model"}
            shaping = {"compose": compose, "template": options.get("template")}
        whole = {"channel_snapshot": channel_snapshot, "key_nonce": key_nonce,
                 "options": shaping, "sources": self._sources.hexdigest()}  # fmt: skip
        return "sha256:" + sha256_hex(canonical_json(whole))


@dataclass(frozen=True)
class Intent:
    """One notification as it will be sent, identical on every attempt."""

    run_id: str
    seq: int
    item_id: str
    channel: str
    target: str
    payload: Mapping[str, Any]
    idempotency_key: str
    intent_digest: str

    @property
    def subject(self) -> str:
        return str(self.payload.get("subject", ""))

    @property
    def body(self) -> str:
        return str(self.payload.get("body", ""))

    @property
    def data(self) -> Mapping[str, Any]:
        data = self.payload.get("data", {})
        return data if isinstance(data, Mapping) else {}

    @property
    def unsubscribe_url(self) -> str | None:
        value = self.payload.get("unsubscribe_url")
        return value if isinstance(value, str) else None

    @property
    def unsubscribe_mailto(self) -> str | None:
        value = self.payload.get("unsubscribe_mailto")
        return value if isinstance(value, str) else None


def make_payload(
    subject: str,
    body: str,
    data: Mapping[str, str],
    not_after: str | None = None,
    unsubscribe_url: str | None = None,
    unsubscribe_mailto: str | None = None,
) -> dict[str, Any]:
    """The payload as digested. The deadline and the unsubscribe addresses are part of it,
    so the digest and an approval cover them; each is absent when there is none, so a
    payload without them digests as it always has."""
    payload: dict[str, Any] = {
        "subject": nfc(subject),
        "body": nfc(body),
        "data": {k: nfc(v) for k, v in data.items()},
    }
    if not_after is not None:
        payload["not_after"] = not_after
    if unsubscribe_url is not None:
        payload["unsubscribe_url"] = unsubscribe_url
    if unsubscribe_mailto is not None:
        payload["unsubscribe_mailto"] = unsubscribe_mailto
    return payload
