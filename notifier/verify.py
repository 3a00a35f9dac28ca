"""`notifier verify`'s check of a run: its chain of events (chain.py), with the audit key
where one is given, and its rows against their replay (replay.py). Pure: the run comes as
plain records from an AuditSource (the live store's store/audit.py today; an exported file
can give the same records), and the verdict is a record the command layer renders.

What each verdict means (docs/guarantees.md has the threat model):
- keyed: every link checked with the run's key, and every row is what the events say;
- unkeyed: checked without a key (a run chained without one, or a keyed run verified
  without its key: then only the links' order), so it shows accidents, not an editor;
- unsigned: planned before the chain existed; there is nothing to check it against;
- altered: something was named: an event missing, edited, inserted or moved, a chain
  keyed with another key (or not keyed at all when a key is given), a row that differs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from .chain import UNKEYED, ChainKind, Signer
from .replay import Change, Difference, EventRecord, RunRows, Table, compare, replay


class AuditVerdict(StrEnum):
    KEYED = "keyed"
    UNKEYED = "unkeyed"
    UNSIGNED = "unsigned"
    ALTERED = "altered"


@dataclass(frozen=True)
class AuditedRun:
    """A run as it is checked: how its events are chained, its rows, its events."""

    run_id: str
    chain: str | None  # ChainKind's value; None: planned before the chain
    key_id: str | None
    rows: RunRows
    events: list[EventRecord]


class AuditSource(Protocol):
    """Where the runs to check are read from, read-only."""

    def run_ids(self) -> list[str]: ...

    def run(self, run_id: str) -> AuditedRun | None: ...


@dataclass(frozen=True)
class RunVerdict:
    run_id: str
    verdict: AuditVerdict
    chain: str | None
    key_id: str | None  # the run's, as recorded
    events: int
    findings: tuple[Difference, ...]


def verify(source: AuditSource, run_ids: Iterable[str], signer: Signer) -> list[RunVerdict]:
    """Each run's verdict (`signer`: the key given, or UNKEYED for none). KeyError for a
    run the source does not hold."""
    verdicts = []
    for run_id in run_ids:
        run = source.run(run_id)
        if run is None:
            raise KeyError(run_id)
        verdicts.append(verify_run(run, signer))
    return verdicts


def verify_run(run: AuditedRun, signer: Signer) -> RunVerdict:
    findings = _chain(run, signer)
    if run.chain is not None:
        # Runs from before the chain wrote events that do not say what each move wrote:
        # their replay would differ from every row without anything having been altered.
        rebuilt = replay(((i.seq, i.item_id) for i in run.rows.items), run.events)
        findings += compare(rebuilt, run.rows)
    if findings:
        verdict = AuditVerdict.ALTERED
    elif run.chain is None:
        verdict = AuditVerdict.UNSIGNED
    elif run.chain == ChainKind.KEYED and signer.key is not None:
        verdict = AuditVerdict.KEYED
    else:
        verdict = AuditVerdict.UNKEYED
    return RunVerdict(run.run_id, verdict, run.chain, run.key_id, len(run.events), tuple(findings))


def _chain(run: AuditedRun, signer: Signer) -> list[Difference]:
    """Every event that breaks the run's chain, named; and a key that is not the run's."""
    if run.chain is None:
        # Unsigned: nothing was chained, so a hash here was put there by someone else.
        return [
            Difference(Table.EVENTS, f"event {e.seq_no}", Change.EXTRA, "hash", e.hash, None)
            for e in run.events
            if e.hash is not None or e.prev_hash is not None
        ]
    found: list[Difference] = []
    try:
        kind = ChainKind(run.chain)
    except ValueError:
        return [
            Difference(
                Table.RUNS,
                "the run",
                Change.DIFFERS,
                "audit_chain",
                run.chain,
                "one of " + ", ".join(k.value for k in ChainKind),
            )
        ]
    link: Signer | None = None  # what checks each link; None: only their order
    if kind is ChainKind.UNKEYED:
        link = UNKEYED
        if signer.key is not None:
            found.append(
                Difference(
                    Table.RUNS,
                    "the run",
                    Change.DIFFERS,
                    "audit_chain",
                    run.chain,
                    ChainKind.KEYED.value,
                )
            )
    elif signer.key is not None:
        if signer.key_id == run.key_id:
            link = signer
        else:
            found.append(
                Difference(
                    Table.RUNS, "the run", Change.DIFFERS, "audit_key_id", run.key_id, signer.key_id
                )
            )
    found += _links(run.events, link)
    return found


def _links(events: list[EventRecord], link: Signer | None) -> list[Difference]:
    found: list[Difference] = []
    expected_no, prev = 1, None
    for e in events:
        for missing in range(expected_no, e.seq_no):
            found.append(Difference(Table.EVENTS, f"event {missing}", Change.MISSING))
        expected_no = e.seq_no + 1
        if e.prev_hash != prev:
            found.append(
                Difference(
                    Table.EVENTS,
                    f"event {e.seq_no}",
                    Change.DIFFERS,
                    "prev_hash",
                    e.prev_hash,
                    prev,
                )
            )
        if link is not None:
            own = link.link(e.prev_hash, e.run_id, e.seq_no, e.kind, e.item_seq, e.detail, e.at)
            if e.hash != own:
                found.append(
                    Difference(
                        Table.EVENTS, f"event {e.seq_no}", Change.DIFFERS, "hash", e.hash, own
                    )
                )
        elif e.hash is None:
            found.append(Difference(Table.EVENTS, f"event {e.seq_no}", Change.MISSING, "hash"))
        prev = e.hash
    return found
