"""Planning: keys and digests per docs/design.md section 5, fingerprint refusal, dry runs."""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from notifier.domain.intent import (
    CONTRACT_VERSION,
    KEY_PREFIX,
    idempotency_key,
    intent_digest,
    make_payload,
    normalise_target,
    payload_json,
)

from ..conftest import EXAMPLE, Workspace, make_rows


def test_keys_are_short_ascii_and_carry_no_personal_data(ws: Workspace) -> None:
    """Every key is printable ASCII, at most 64 characters, unique, and does not contain the
    recipient; every digest is sha256 over the intent."""
    assert ws.invoke("send", str(EXAMPLE)).exit_code == 0
    nonce = ws.ledger.run().key_nonce
    assert nonce is not None
    items = ws.ledger.items()
    keys = [i.idempotency_key for i in items]
    assert len(set(keys)) == 100
    for i in items:
        run_id, item_id, target, key, digest, channel = (
            i.run_id, i.item_id, i.target, i.idempotency_key, i.intent_digest, i.channel
        )  # fmt: skip
        payload = ws.ledger.payload(i.seq)
        assert re.fullmatch(r"[\x21-\x7e]{1,64}", key)
        assert target.split("@")[0] not in key
        assert re.fullmatch(r"[0-9a-f]{16}", nonce)
        assert key == idempotency_key(run_id, nonce, item_id, target)
        assert digest == intent_digest(channel, target, payload)
        assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest)


def test_digest_changes_with_the_payload_and_ignores_unicode_form() -> None:
    """A changed payload is a new intent; NFC and NFD spellings of a text are the same one."""
    base = {"subject": "Café", "body": "b", "data": {}}
    nfd = {"subject": "Cafe\u0301", "body": "b", "data": {}}
    assert intent_digest("outbox", "a@example.com", base) == intent_digest(
        "outbox", "a@example.com", nfd
    )
    assert intent_digest("outbox", "a@example.com", base) != intent_digest(
        "outbox", "a@example.com", {**base, "body": "c"}
    )
    assert intent_digest("outbox", "a@example.com", base) == intent_digest(
        "outbox", " a@EXAMPLE.com ", base
    )


def test_keys_and_digests_keep_their_bytes_across_versions() -> None:
    """The key and the digest of one fixed intent are the values every earlier version
    computed: a faster encoding must never change what a stored run compares against."""
    payload = {
        "subject": 'Cafe\u0301 "q"',
        "body": "b\\n\u2028",
        "data": {"plan": "te\u0301am", "a": ""},
        "not_after": "2026-12-01T09:00:00Z",
    }
    digest = intent_digest("hooks", " Zo\u00eb@EXAMPLE.com ", payload)
    assert digest == "sha256:69afceed2788564325d11aaf6b0288057cdd6f5c4d0eaee4aa85d5a7032ceb66"
    key = idempotency_key("run-1", "00ff00ff00ff00ff", "b1", " Zo\u00eb@EXAMPLE.com ")
    assert key == "ntf1-94ed1b46e8e26b18a71fbb8fb1369b60f04ab745"


_text = st.text(st.characters(codec="utf-8"), max_size=12)


@given(channel=_text, target=_text, subject=_text, data=st.dictionaries(_text, _text, max_size=3))
def test_the_digest_is_sha256_of_the_whole_intent_encoded_at_once(
    channel: str, target: str, subject: str, data: dict[str, str]
) -> None:
    """Whatever the text, the digest equals sha256 over the NFC of the whole intent document
    encoded in one json.dumps (the formula of docs/design.md section 5), not only over its parts."""
    payload = {"subject": subject, "body": subject[::-1], "data": data}
    whole = {
        "contract_version": CONTRACT_VERSION,
        "channel": channel,
        "target": normalise_target(target),
        "payload": payload,
    }
    text = json.dumps(whole, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    expected = hashlib.sha256(unicodedata.normalize("NFC", text).encode("utf-8")).hexdigest()
    assert intent_digest(channel, target, payload) == "sha256:" + expected


@given(
    texts=st.lists(_text, min_size=4, max_size=4),
    data=st.dictionaries(_text, _text, max_size=4),
    deadline=st.none() | _text,
)
def test_the_stored_payload_and_the_key_are_the_canonical_json_formulas(
    texts: list[str], data: dict[str, str], deadline: str | None
) -> None:
    """The payload text planning stores is the NFC of json.dumps(sort_keys) of the payload,
    and a key hashes the NFC of json.dumps of its components, whatever the text."""

    def canonical(value: object) -> str:
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return unicodedata.normalize("NFC", text)

    subject, body, item_id, target = texts
    stored = payload_json(subject, body, data, deadline)
    assert stored == canonical(make_payload(subject, body, data, deadline))
    parts = ["run-1", "00ff00ff00ff00ff", item_id, normalise_target(target), CONTRACT_VERSION]
    hashed = hashlib.sha256(canonical(parts).encode("utf-8")).hexdigest()
    assert idempotency_key("run-1", "00ff00ff00ff00ff", item_id, target) == KEY_PREFIX + hashed[:40]


def test_same_batch_again_has_nothing_to_send_unless_new_run(ws: Workspace) -> None:
    """Re-sending a delivered batch plans nothing (exit 0, naming the run that delivered
    it); --new-run sends it again under new keys."""
    assert ws.invoke("send", str(EXAMPLE)).exit_code == 0
    run_id = ws.ledger.run().run_id
    again = ws.invoke("send", str(EXAMPLE))
    assert again.exit_code == 0
    assert run_id in again.output and "nothing to send" in again.output
    assert len(ws.ledger.runs()) == 1
    assert len(ws.outbox_documents()) == 100

    fresh = ws.invoke("send", str(EXAMPLE), "--new-run")
    assert fresh.exit_code == 0, fresh.output
    assert len(ws.ledger.runs()) == 2
    assert len(set(ws.ledger.keys())) == 200
    assert len(ws.outbox_documents()) == 200


def test_dry_run_writes_nothing(ws: Workspace) -> None:
    """--dry-run validates and summarises the plan without creating a database or a file."""
    result = ws.invoke("send", str(EXAMPLE), "--dry-run")
    assert result.exit_code == 0, result.output
    assert "100 notifications" in result.output and "sha256:" in result.output
    assert not ws.db_file.exists()
    assert not ws.outbox.exists()


@pytest.mark.both_stores
def test_dry_run_on_an_empty_database_shows_the_plan(ws: Workspace) -> None:
    """A dry run against a database with no notifier tables yet (a new PostgreSQL schema,
    a missing file) shows the plan as all new, writing nothing, on either store."""
    ws.write_csv("b.csv", make_rows(3))
    result = ws.invoke("send", "b.csv", "--dry-run")
    assert result.exit_code == 0, result.output
    assert "dry run: 3 notifications" in result.output
    assert not ws.has_database()


def test_dry_run_on_a_planned_batch_names_the_run(ws: Workspace) -> None:
    """A dry run of a batch already delivered names the run that delivered it and what
    send would plan (nothing), and changes nothing."""
    ws.write_csv("b.csv", make_rows(3))
    assert ws.invoke("send", "b.csv").exit_code == 0
    before = ws.db_file.read_bytes()
    run_id = ws.ledger.run().run_id
    result = ws.invoke("send", "b.csv", "--dry-run")
    assert result.exit_code == 0
    assert f"3 row(s) already delivered with the same content by run {run_id}" in result.output
    assert "send would plan 0 of them" in result.output
    assert ws.db_file.read_bytes() == before


def test_run_id_option_and_status_json(ws: Workspace) -> None:
    """--run-id names the run; status --json has the contract's fields and counts."""
    ws.write_csv("b.csv", make_rows(5))
    assert ws.invoke("send", "b.csv", "--run-id", "welcome-2026").exit_code == 0
    status = ws.status()
    assert status["run_id"] == "welcome-2026"
    assert status["state"] == "completed"
    assert status["fingerprint"].startswith("sha256:")
    assert status["counts"] == {
        "total": 5, "sent": 5, "unknown": 0, "pending": 0, "failed": 0, "in_flight": 0,
        "expired": 0, "suppressed": 0,
    }  # fmt: skip
    first = status["items"][0]
    for field in ("seq", "id", "channel", "to", "state", "idempotency_key", "intent_digest",
                  "receipt_id", "attempts", "last_error"):  # fmt: skip
        assert field in first
    assert (first["seq"], first["id"], first["to"], first["attempts"]) == (
        1, "u1", "user1@example.com", 1,
    )  # fmt: skip
    runs = ws.invoke("runs")
    assert "welcome-2026" in runs.output and "completed" in runs.output


def test_status_without_a_database_is_a_clear_usage_error(ws: Workspace) -> None:
    """Asking for status before any send exits 2 and says what to do."""
    result = ws.invoke("status")
    assert result.exit_code == 2
    assert "notifier send" in result.output
    assert not ws.db_file.exists()
