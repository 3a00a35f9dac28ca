"""The suppression list (m008): the list and its audit, and the three places an item
meets it: when it is planned, when it is claimed for sending, and when a relay rejects its
recipient for good. Every item move here is a conditional UPDATE through state_machine.py."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from notifier.domain import clock
from notifier.domain.records import Item, Outcome
from notifier.domain.state_machine import ItemState, ItemTrigger, item_next
from notifier.domain.suppression import (
    Entry,
    Source,
    Suppression,
    address_key,
    address_keys,
    sql_keys_alike,
)
from notifier.domain.who import operator_name
from notifier.store import statements
from notifier.store.core import Core, retried
from notifier.store.statements import suppressions as sql


class Suppressions:
    """The suppression list, shared by every run of the database."""

    def __init__(self, core: Core) -> None:
        self.core = core

    def on_list(self) -> str:
        """A column for the claim's SELECT: whether the row's recipient is on the list, as
        far as SQL can tell (see suppressed_claims). Read by the claim's own query, it costs
        no statement of its own: one primary-key probe per row."""
        return sql.on_list(self.core.dialect)

    # ---------------------------------------------------------------- the list

    @retried  # a relay's rejection recorded by a worker may insert the same address
    def suppress(
        self,
        entries: Sequence[Entry],
        source: Source,
        operator: str,
        *,
        run_id: str | None = None,
    ) -> list[str]:
        """Add `entries` to the list, each audited, in one transaction (an import is stored
        whole or not at all). An address already there keeps its row (its first reason and
        source). Returns the addresses newly added."""
        with self.core.write():
            return self._add(entries, source, operator, clock.now_iso(), run_id)

    def _add(
        self,
        entries: Sequence[Entry],
        source: Source,
        operator: str,
        at: str,
        run_id: str | None,
    ) -> list[str]:
        added: list[str] = []
        # In address order, as every writer of the list: two never wait for each other's rows
        # in a cycle (an import beside a worker suppressing a rejected recipient).
        for entry in sorted(entries, key=lambda e: e.address):
            cursor = self.core.engine.execute(
                sql.ADD_SUPPRESSION,
                {
                    "address": entry.address,
                    "reason": entry.reason,
                    "source": source.value,
                    "operator": operator,
                    "at": at,
                },
            )
            if cursor.rowcount == 1:
                added.append(entry.address)
                self._audit("add", entry, source, operator, at, run_id)
        return added

    @retried
    def unsuppress(self, addresses: Sequence[str], operator: str) -> list[str]:
        """Remove `addresses` (keys) from the list, each removal audited with the row it
        removed; returns those that were there."""
        at = clock.now_iso()
        removed: list[str] = []
        with self.core.write():
            for address in addresses:
                row = self.core.engine.execute(sql.SUPPRESSION_OF, {"address": address}).fetchone()
                if row is None:
                    continue
                self.core.engine.execute(sql.DELETE_SUPPRESSION, {"address": address})
                entry = Entry(address, row.reason)
                self._audit("remove", entry, Source(row.source), operator, at, None)
                removed.append(address)
        return removed

    def _audit(
        self, action: str, entry: Entry, source: Source, operator: str, at: str, run_id: str | None
    ) -> None:
        self.core.engine.execute(
            sql.AUDIT_SUPPRESSION,
            {
                "at": at,
                "operator": operator,
                "action": action,
                "address": entry.address,
                "source": source.value,
                "reason": entry.reason,
                "run_id": run_id,
            },
        )

    def suppressions(self) -> list[Suppression]:
        """The whole list, by address (none from a database before m008, opened read-only)."""
        if not self.core.engine.has_table("suppressions"):
            return []
        return [
            Suppression(address, reason, Source(source), operator, created_at)
            for address, reason, source, operator, created_at in self.core.engine.execute(
                sql.ALL_SUPPRESSIONS
            )
        ]

    def suppression_audit(self) -> list[dict[str, Any]]:
        """Every add and remove, oldest first."""
        if not self.core.engine.has_table("suppression_audit"):
            return []
        return [row._asdict() for row in self.core.engine.execute(sql.SUPPRESSION_AUDIT)]

    def among(self, items: Iterable[Item]) -> frozenset[int]:
        """The seqs of `items` whose recipient is on the list now: one read by the list's
        primary key. The committer asks it about the items it has in flight, about every
        POLL_S (Runner._revisit), and publishes the answer (Dispatch.suppressed_seen) so
        that no sender starts one whose address was suppressed after its claim: such an
        address gets only the requests under way, or whose check passed, before the look."""
        seqs_of: dict[str, list[int]] = {}
        for item in items:
            for key in address_keys(item.target):
                seqs_of.setdefault(key, []).append(item.seq)
        if not seqs_of:
            return frozenset()
        found = self.core.engine.execute(
            sql.suppressed_among(len(seqs_of)), statements.bound("a", sorted(seqs_of))
        ).fetchall()
        return frozenset(seq for (address,) in found for seq in seqs_of[address])

    # ---------------------------------------------------------------- items

    def suppress_planned(self, run_id: str, at: str) -> int:
        """At plan time, inside the plan's transaction: the new run's pending items whose
        recipient is on the list become `suppressed` (their intents stay stored, so the
        fingerprint, an approval and the report cover them). An empty list, the common
        case, costs one read; otherwise one pass over the run's items, each looked up by
        the list's primary key. Returns how many were suppressed."""
        if self.core.engine.execute(sql.ANY_SUPPRESSION).fetchone() is None:
            return 0
        current = ItemState.PENDING
        target = item_next(ItemTrigger.SUPPRESS, current)
        error = "suppressed: the recipient is on the suppression list"
        moved = self.core.engine.execute(
            sql.suppress_planned(self.core.dialect, current),
            {"target": target.value, "at": at, "error": error, "run_id": run_id},
        ).rowcount
        if moved:
            # At plan time every suppressed item of the run is one just moved. Numbered as
            # every event is (on PostgreSQL at COMMIT, under the run's row: see _commit).
            seqs = [
                seq
                for (seq,) in self.core.engine.execute(
                    sql.SEQS_IN_STATE, {"run_id": run_id, "state": target.value}
                )
            ]
            detail = {"from": current.value, "to": target.value, "when": "plan",
                      "set": {"last_error": error}}  # fmt: skip
            self.core.events(run_id, ItemTrigger.SUPPRESS.value, seqs, detail, at)
        return int(moved)

    def suppressed_claims(self, run_id: str, rows: Sequence[Any], at: str) -> set[int]:
        """The claim's check, inside the claim's transaction, before any of `rows` (pending
        items about to be claimed) is moved: those whose recipient is on the list become
        `suppressed` instead, and their seqs are returned for the claim to leave out. The
        claim's SELECT already asked the list (its `on_list` column, on_list): for the usual
        recipient, ASCII and without surrounding tabs, that SQL match is the Python key's, so
        nothing more is read; only rows SQL cannot judge (non-ASCII capitals) are looked up
        here, in one indexed read for the whole batch.

        What this covers: every `suppress add` (or import, or relay rejection) committed
        before the claim's transaction, whatever the run's state then (running, paused,
        held by a wait): the claim and the list are read in one transaction, so nothing
        can slip between the check and the move. An address suppressed after its item was
        claimed (in_flight, waiting for its sender) is caught by the committer's look at
        the list (`listed`, at most every POLL_S) and the senders' check before each send;
        what remains is a request already started, or whose check passed, before that
        look."""
        hits = {row.seq for row in rows if row.on_list}
        keys: dict[str, list[int]] = {}
        for row in rows:
            if not row.on_list and not sql_keys_alike(row.target):
                for key in address_keys(row.target):
                    keys.setdefault(key, []).append(row.seq)
        if keys:
            for (address,) in self.core.engine.execute(
                sql.suppressed_among(len(keys)), statements.bound("a", list(keys))
            ).fetchall():
                hits.update(keys[address])
        suppressed: set[int] = set()
        for seq in sorted(self._maybe_delivered(run_id, sorted(hits))):
            # An earlier attempt may have reached the recipient: calling it suppressed (never
            # sent) would claim what nobody knows, as expiring it would (ledger.expire_due).
            # It is not sent again either: unknown, for a query or an operator to settle.
            self.core.move_item(
                run_id,
                seq,
                ItemState.PENDING,
                ItemTrigger.DOUBT,
                at,
                next_attempt_at=None,  # asked about by `reconcile`, not waited for here
                last_error="suppressed after an attempt that may have been delivered: not "
                "sent again until a query or a decision by hand settles it",
            )
            suppressed.add(seq)
        for seq in sorted(set(hits) - suppressed):
            self.core.move_item(
                run_id,
                seq,
                ItemState.PENDING,
                ItemTrigger.SUPPRESS,
                at,
                last_error="suppressed: the recipient was put on the suppression list "
                "before its send",
            )
            suppressed.add(seq)
        return suppressed

    def _maybe_delivered(self, run_id: str, seqs: Sequence[int]) -> set[int]:
        """Of `seqs` (pending), those with an attempt that may have been delivered."""
        if not seqs:
            return set()
        return {
            seq
            for (seq,) in self.core.engine.execute(
                sql.attempted_maybe_delivered(len(seqs)),
                {"run_id": run_id, **statements.bound("s", seqs)},
            )
        }

    def suppress_rejected(self, run_id: str, outcomes: Sequence[Outcome], at: str) -> None:
        """A relay's permanent rejection of a recipient (outcome.suppress_reason, set where
        its channel's `suppress_on_reject` is on) puts the address on the list with the reply
        as its reason (source `relay`), in the transaction that records the failure."""
        rejected = [o for o in outcomes if o.suppress_address is not None]
        if not rejected:
            return
        entries = [
            Entry(address_key(o.suppress_address or ""), o.suppress_reason) for o in rejected
        ]
        # The operator is whoever runs the send that met the rejection.
        self._add(entries, Source.RELAY, operator_name(), at, run_id)
