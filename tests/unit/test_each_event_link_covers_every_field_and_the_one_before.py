"""An event's link (chain.py) changes with every field of the event and with the link
before it, and two different events never share a canonical form (a field's text moved into
its neighbour, None for an empty text); keyed links differ from unkeyed ones and by key, and
a key's id names the key without holding it. Pure: no store."""

from __future__ import annotations

from dataclasses import astuple, dataclass, replace

import pytest

from notifier.domain.chain import UNKEYED, ChainKind, Signer, canonical, key_id, signer_from


@dataclass(frozen=True)
class Event:
    prev_hash: str | None = "ab" * 32
    run_id: str = "r1"
    seq_no: int = 7
    kind: str = "ack"
    item_seq: int | None = 3
    detail: str | None = '{"from": "in_flight", "to": "sent"}'
    at: str = "2026-12-06T10:00:00+00:00"


BASE = Event()
CHANGED = [
    replace(BASE, prev_hash=None),
    replace(BASE, prev_hash="cd" * 32),
    replace(BASE, run_id="r2"),
    replace(BASE, seq_no=8),
    replace(BASE, kind="found"),
    replace(BASE, item_seq=None),
    replace(BASE, item_seq=4),
    replace(BASE, detail=None),
    replace(BASE, detail=""),
    replace(BASE, detail='{"from": "in_flight", "to": "failed"}'),
    replace(BASE, at="2026-12-06T10:00:01+00:00"),
    # A field's text moved into its neighbour: the same characters in a row.
    replace(BASE, run_id="r17", seq_no=7, kind="ack"),
    replace(BASE, kind="ack3", item_seq=None),
]


@pytest.mark.parametrize("signer", [UNKEYED, Signer(b"k1")], ids=["unkeyed", "keyed"])
@pytest.mark.parametrize("changed", CHANGED, ids=[str(i) for i in range(len(CHANGED))])
def test_changing_any_field_changes_the_link(signer: Signer, changed: Event) -> None:
    assert canonical(*astuple(changed)) != canonical(*astuple(BASE))
    assert signer.link(*astuple(changed)) != signer.link(*astuple(BASE))


def test_the_same_event_links_the_same_way_every_time() -> None:
    assert Signer(b"k1").link(*astuple(BASE)) == Signer(b"k1").link(*astuple(BASE))


def test_keyed_links_differ_from_unkeyed_and_by_key() -> None:
    links = {s.link(*astuple(BASE)) for s in (UNKEYED, Signer(b"k1"), Signer(b"k2"))}
    assert len(links) == 3
    assert (UNKEYED.kind, Signer(b"k1").kind) == (ChainKind.UNKEYED, ChainKind.KEYED)


def test_a_key_id_names_the_key_without_holding_it() -> None:
    ident = key_id(b"a secret key")
    assert len(ident) == 16 and ident != key_id(b"another secret key")
    assert "secret" not in ident
    assert "a secret key" not in repr(Signer(b"a secret key"))
    assert UNKEYED.key_id is None


def test_the_environment_key_wins_over_the_key_file() -> None:
    assert signer_from("env key", "file key\n").key == b"env key"
    assert signer_from(None, "file key\n").key == b"file key"  # its line break is not the key
    assert signer_from(None, None) is UNKEYED
    assert signer_from("", "  \n") is UNKEYED
