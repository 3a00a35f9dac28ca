"""What happened in a run: sent / unknown / pending / failed, as a table, JSON or CSV."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Set
from typing import TYPE_CHECKING, Any

from notifier.domain import clock
from notifier.domain.cells import safe_cell
from notifier.domain.records import FailedKind, Item, PendingKind, Run
from notifier.domain.state_machine import FINISHED_RUN_STATES, ItemState, RunState
from notifier.engine.membership import holder_alive, live_holder
from notifier.ops import approval
from notifier.store import Store
from notifier.store.drafts import run_counts

if TYPE_CHECKING:
    from rich.console import Console

ITEM_FIELDS = (
    "seq",
    "id",
    "channel",
    "to",
    "state",
    "idempotency_key",
    "intent_digest",
    "receipt_id",
    "attempts",
    "last_error",
    "receipt_source",
    "evidence",
    "pending_kind",
    "failed_kind",
)
_ATTENTION = (ItemState.UNKNOWN, ItemState.FAILED, ItemState.IN_FLIGHT)


def build(
    store: Store,
    run: Run,
    *,
    attention_only: bool = False,
    states: Sequence[ItemState] | None = None,
) -> dict[str, Any]:
    """The report object of the CLI contract (docs/design.md section 11). With `attention_only` (the
    table), only the items someone has to look at are read, through indexes: a 1M-item run
    costs what its unknown, failed and retried items cost. Otherwise `items` is an iterator
    read from the database as it is written out (to_json / to_csv stream it): no list of a
    million dicts. With `states` (`--state`), `items` holds exactly the items in those
    states, in every format; the counts stay those of the whole run."""
    # `pending` alone would call a retry that may have been delivered "never attempted".
    kinds = store.queries.pending_kinds(run.run_id)
    # `failed` alone would put a row an operator abandoned (nobody can tell: maybe
    # delivered) among those who never got it.
    abandoned = store.queries.abandoned_seqs(run.run_id)
    items: Iterable[dict[str, Any]]
    if states:
        items = (
            _item_row(item, source, evidence, kinds, abandoned)
            for item, source, evidence in store.queries.items_with_receipts(run.run_id, states)
        )
    elif attention_only:
        # Every attempted pending item, with its last error: one that may have been
        # delivered, and one that waits for its own retry (a recipient's 4xx at RCPT, a 5xx),
        # which an operator should see before its attempts run out.
        chosen = sorted(
            [
                *store.queries.items(run.run_id, _ATTENTION),
                *(store.queries.item(run.run_id, s) for s in kinds),
            ],
            key=lambda i: i.seq,
        )
        items = [_item_row(item, None, None, kinds, abandoned) for item in chosen]
    else:
        items = (
            _item_row(item, source, evidence, kinds, abandoned)
            for item, source, evidence in store.queries.items_with_receipts(run.run_id)
        )
    counts = run_counts(store, run)  # a run still drafting: its rows
    attempted = list(kinds.values())
    # Added to the contract's keys, only with --state: which items `items` holds.
    state_filter = {"state_filter": [s.value for s in states]} if states else {}
    return {
        "run_id": run.run_id,
        "state": effective_state(store, run).value,
        "fingerprint": run.fingerprint,
        "created_at": run.created_at,
        "batch": run.batch_path,
        "stop_reason": run.stop_reason,
        "paused_until": run.paused_until,
        "cancel_requested_at": run.cancel_requested_at,
        "approval": run.approval,
        # Added to the contract's keys: when the approval expired, while the run is still
        # to send (it then sends nothing until approved again); None otherwise.
        "approval_expired_at": approval.lapsed(run),
        "counts": counts.as_json(),
        # Added to the contract's keys: the `pending` count split by why it is pending.
        "pending_detail": {
            PendingKind.NEVER_ATTEMPTED.value: counts.pending - len(attempted),
            PendingKind.RETRY_WAITING.value: attempted.count(PendingKind.RETRY_WAITING),
            PendingKind.MAYBE_DELIVERED.value: attempted.count(PendingKind.MAYBE_DELIVERED),
        },
        # Added to the contract's keys: the `failed` count split into rows never delivered
        # and rows an operator abandoned, which may have been delivered.
        "failed_detail": counts.failed_detail(),
        # Added to the contract's keys: pending items whose start time or send window is
        # still ahead, and when the first of them may go.
        "waiting": _waiting(store, run),
        "drafts": _drafts(store, run),
        # Added to the contract's keys: who works the run now (PostgreSQL: many workers).
        "workers": _workers(store, run),
        **state_filter,
        "items": items,
        "decisions": [
            {
                "seq": d.seq,
                "id": d.item_id,
                "operator": d.operator,
                "at": d.at,
                "decision": d.decision,
                "evidence": d.evidence,
            }
            for d in store.queries.decisions(run.run_id)
        ],
    }


def _waiting(store: Store, run: Run) -> dict[str, Any]:
    waiting = store.queries.waiting(run.run_id)
    return {"count": waiting.count, "next_opens_at": waiting.next_at}


def _item_row(
    item: Item,
    source: str | None,
    evidence: str | None,
    kinds: Mapping[int, PendingKind],
    abandoned: Set[int],
) -> dict[str, Any]:
    return {
        "seq": item.seq,
        "id": item.item_id,
        "channel": item.channel,
        "to": item.target,
        "state": item.state.value,
        "idempotency_key": item.idempotency_key,
        "intent_digest": item.intent_digest,
        "receipt_id": item.receipt_id,
        "attempts": item.attempts,
        "last_error": item.last_error,
        "receipt_source": source,
        "evidence": evidence,
        "pending_kind": _pending_kind(item.state, kinds.get(item.seq)),
        "failed_kind": _failed_kind(item.state, item.seq in abandoned),
    }


def _pending_kind(state: ItemState, kind: PendingKind | None) -> str | None:
    if state is not ItemState.PENDING:
        return None
    return (kind or PendingKind.NEVER_ATTEMPTED).value


def _failed_kind(state: ItemState, abandoned: bool) -> str | None:
    if state is not ItemState.FAILED:
        return None
    return (FailedKind.ABANDONED if abandoned else FailedKind.NOT_DELIVERED).value


def _drafts(store: Store, run: Run) -> dict[str, Any] | None:
    """--compose runs: drafting progress, tokens spent, and the rows whose draft failed."""
    if not run.options.get("compose"):
        return None
    summary: dict[str, Any] = dict(store.drafts.draft_summary(run.run_id))
    summary["model"] = run.options["compose"].get("model")
    if run.options["compose"].get("batch_api"):
        summary["chunks"] = store.chunks.chunk_summary(run.run_id)  # Message Batches progress
    summary["failures"] = [
        {"seq": seq, "line": line, "error": error}
        for seq, line, error in store.drafts.draft_failures(run.run_id)
    ]
    return summary


def effective_state(store: Store, run: Run) -> RunState:
    """A run left `running` by a worker that died is, in effect, paused (docs/design.md section 3);
    a shared run is running while any of its workers lives."""
    if run.state is RunState.RUNNING and live_holder(store, run) is None:
        return RunState.PAUSED
    return run.state


def _workers(store: Store, run: Run) -> list[dict[str, Any]]:
    """The live workers of a shared run (PostgreSQL), as `status` shows them."""
    return [
        {
            "host": w.host,
            "pid": w.pid,
            "joined_at": w.joined_at,
            "heartbeat_at": w.heartbeat_at,
            "expires_at": w.expires_at,
            "in_flight": w.in_flight,
        }
        for w in store.leases.live_workers(run.run_id)
        if holder_alive(w.owner, w.expires_at)
    ]


def to_json(report: dict[str, Any]) -> str:
    return "".join(iter_json(report))


def iter_json(report: dict[str, Any]) -> Iterator[str]:
    """The report as indented JSON, in pieces: each item is encoded as it is read, so a
    million items never sit in memory. Byte for byte what json.dumps(indent=2) would give."""
    fields = list(report)
    yield "{"
    for n, key in enumerate(fields):
        yield ("\n" if n == 0 else ",\n") + f"  {_dumps(key)}: "
        value = report[key]
        if key != "items":
            yield _indent(_dumps(value))
            continue
        first = True
        for item in value:
            yield ("[\n" if first else ",\n") + "    " + _indent(_dumps(item), "    ")
            first = False
        yield "[]" if first else "\n  ]"
    yield "\n}" if fields else "}"


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=2)


def _indent(text: str, prefix: str = "  ") -> str:
    """Every line after the first moved right by `prefix` (the first follows a key)."""
    return text.replace("\n", "\n" + prefix)


def to_csv(report: dict[str, Any]) -> str:
    return "".join(iter_csv(report))


def iter_csv(report: dict[str, Any]) -> Iterator[str]:
    """The items as CSV, a row at a time (written as they are read from the database)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(ITEM_FIELDS)
    for n, item in enumerate(report["items"], start=1):
        writer.writerow([safe_cell(item[name]) for name in ITEM_FIELDS])
        if n % 1000 == 0:
            yield buffer.getvalue()
            buffer.seek(0)
            buffer.truncate()
    yield buffer.getvalue()


def render_table(report: dict[str, Any], console: Console) -> bool:
    """The run, its counts and the items needing attention; True when that table left out
    the idempotency keys (too narrow a terminal), for the command to say where they are.
    The manual decisions follow it (render_decisions)."""
    # rich loads only for a table: a send on a pipe prints none.
    from rich.table import Table  # noqa: PLC0415
    from rich.text import Text  # noqa: PLC0415

    counts = report["counts"]
    items = list(report["items"])  # the table is built from the attention items only
    console.print(
        Text.assemble(
            ("run ", "bold"), (report["run_id"], "bold"), "  state: ", (report["state"], "bold")
        )
    )
    drafting = report.get("drafts") and not report["fingerprint"]
    fingerprint = "none yet: computed once every row is drafted" if drafting else None
    console.print(f"fingerprint: {fingerprint or report['fingerprint']}")
    if report.get("approval_expired_at"):
        console.print(
            f"approval: expired at {clock.local(report['approval_expired_at'])}; nothing more is "
            "sent until the run is approved again"
        )
    if report.get("stop_reason"):
        console.print(f"stopped because: {report['stop_reason']}")
    if _left_unsent_by(report) == "being cancelled":
        at = clock.local(report["cancel_requested_at"])
        asked = f"cancel: asked for at {at} and not finished"
        if report["state"] == RunState.RUNNING.value:
            # A live worker (effective_state): until it next reads the run's flags, a request
            # it claimed ahead may still start (docs/guarantees.md, Cancel); it closes the run.
            console.print(
                f"{asked}; the worker still at work stops at its next look (a request it "
                "already claimed may still start until then) and closes the run as cancelled"
            )
        else:
            console.print(
                f"{asked}; nothing more is sent, and the run is closed as cancelled by its "
                "next resume or cancel"
            )
    _render_drafts(report.get("drafts"), console)
    summary = Table(show_header=True, header_style="bold")
    columns = (
        "total", "sent", "unknown", "pending", "failed", "in_flight", "expired", "suppressed"
    )  # fmt: skip
    for name in columns:
        summary.add_column(name, justify="right")
    summary.add_row(*(str(counts.get(name, 0)) for name in columns))
    console.print(summary)
    for worker in report.get("workers") or ():
        console.print(
            f"worker: pid {worker['pid']} on {worker['host']}, {worker['in_flight']} in flight, "
            f"heartbeat {clock.local(worker['heartbeat_at'])}"
        )
    detail = report["pending_detail"]
    unsent_by = _left_unsent_by(report)
    unsent = unsent_by is not None
    left = unsent and any(detail.values())
    waits = "" if unsent else " (waiting to retry)"
    console.print(
        f"pending: {detail['never_attempted']} never attempted, {detail['retry_waiting']} "
        f"attempted and not delivered{waits}, {detail['maybe_delivered']} "
        f"attempted and maybe delivered{waits}"
        # Rows a run leaves unsent (a file sent again plans them) never wait for a retry
        # that will not come.
        + (f"; the run is {unsent_by}: none of them is sent by this run" if left else "")
    )
    failed = report.get("failed_detail") or {}
    if failed.get(FailedKind.ABANDONED):
        # Failed in the ledger, yet nobody can tell whether its recipient got it: never
        # counted with the rows the receiver refused.
        console.print(
            f"failed: {failed[FailedKind.NOT_DELIVERED]} not delivered, "
            f"{failed[FailedKind.ABANDONED]} abandoned by an operator (maybe delivered)"
        )
    waiting = report.get("waiting") or {}
    if waiting.get("count"):
        console.print(
            f"waiting: {waiting['count']} pending item(s) wait for their start time or send "
            f"window; the next opens at {clock.local(waiting['next_opens_at'])}"
        )
    chosen = report.get("state_filter")
    attempted = (PendingKind.MAYBE_DELIVERED.value, PendingKind.RETRY_WAITING.value)
    attention = [
        i for i in items if chosen or i["state"] in _ATTENTION or i["pending_kind"] in attempted
    ]
    if chosen and not attention:
        console.print(f"no item is {' or '.join(chosen)}.")
    if not attention:
        return False
    title = f"items {' or '.join(chosen)}" if chosen else "items needing attention"
    return _attention_table(title, attention, console, unsent=unsent)


def render_decisions(report: dict[str, Any], console: Console) -> None:
    """The manual decisions recorded on the run's items, if any."""
    from rich.table import Table  # noqa: PLC0415 (rich loads only for a table)

    if report["decisions"]:
        table = Table(title="manual decisions", show_header=True, header_style="bold")
        for name in ("seq", "id", "decision", "operator", "at", "evidence"):
            table.add_column(name, overflow="fold")
        for d in report["decisions"]:
            table.add_row(
                str(d["seq"]), d["id"], d["decision"], d["operator"], d["at"], d["evidence"]
            )
        console.print(table)


# Narrower than this, the attention table leaves out the idempotency key (45 characters,
# never folded: it is copied whole) so that each row stays a few lines high.
KEY_COLUMN_MIN_WIDTH = 150
_GAP = 2  # between two columns of the attention table (no edges)


def _attention_table(
    title: str, attention: list[dict[str, Any]], console: Console, *, unsent: bool
) -> bool:
    """The items to look at, fitted to the terminal (True when it left out the idempotency
    keys to fit): short columns never wrap, and when the
    long ones (id, to, state, last_error) do not fit on one line they fold (every character
    still shown) at widths chosen to keep rows low: an ordinary row takes at most 3 lines at
    80 columns."""
    from rich import box  # noqa: PLC0415 (rich loads only for a table)
    from rich.cells import cell_len  # noqa: PLC0415
    from rich.table import Table  # noqa: PLC0415
    from rich.text import Text  # noqa: PLC0415

    with_key = console.width >= KEY_COLUMN_MIN_WIDTH
    columns: list[tuple[str, bool]] = [  # (header, folds)
        ("seq", False), ("id", True), ("to", True), ("state", True), ("tries", False),
        *([("idempotency_key", False)] if with_key else []), ("last_error", True),
    ]  # fmt: skip
    rows = [
        [
            str(i["seq"]),
            i["id"],
            i["to"],
            _state_label(i, unsent),
            str(i["attempts"]),
            *([i["idempotency_key"]] if with_key else []),
            i["last_error"] or "",
        ]
        for i in attention
    ]
    natural = [
        max([cell_len(header), *(cell_len(row[n]) for row in rows)])
        for n, (header, _) in enumerate(columns)
    ]
    longest = [sorted((row[n] for row in rows), key=cell_len)[-3:] for n in range(len(columns))]

    def lines(column: int, width: int) -> int:
        """Lines the longest values of `column` take at `width` (its header included)."""
        values = [columns[column][0], *longest[column]]
        return max(len(Text(v).wrap(console, width, overflow="fold")) for v in values)

    room = console.width - _GAP * (len(columns) - 1)
    widths = fit_widths(natural, [folds for _, folds in columns], room, lines)
    table = Table(
        title=title,
        show_header=True,
        header_style="bold",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        collapse_padding=True,
    )
    for (header, folds), width in zip(columns, widths, strict=True):
        right = not folds and header != "idempotency_key"  # the numbers
        table.add_column(
            header,
            width=width,
            no_wrap=not folds,
            overflow="fold",
            justify="right" if right else "left",
        )
    for row in rows:
        table.add_row(*row)
    console.print(table)
    return not with_key


def fit_widths(
    natural: Sequence[int], folds: Sequence[bool], room: int, lines: Callable[[int, int], int]
) -> list[int | None]:
    """Widths for columns of `natural` widths in `room` cells: None (as wide as its content)
    for each when all fit. Otherwise the columns that fold share what the others leave:
    each gets the narrowest width at which `lines(column, width)` (its longest values, word
    wrapped) takes no more lines than the fewest any sharing allows; what is left buys the
    cheapest lines back, then goes to the last. Where not even 12 lines fit,
    rich's own shrinking decides (all None)."""
    if sum(natural) <= room:
        return [None] * len(natural)
    share = room - sum(w for w, f in zip(natural, folds, strict=True) if not f)
    flexible = [n for n, f in enumerate(folds) if f]
    for most in range(2, 13):
        need = [_narrowest(n, natural[n], most, lines) for n in flexible]
        if sum(need) <= share:
            break
    else:
        return [None] * len(natural)
    spare = share - sum(need)
    given = dict(zip(flexible, need, strict=True))
    # The rows are `most` lines high whatever the rest goes to: it saves the cheapest lines
    # first (a state or a recipient folded less), one line at a time, then widens the last.
    while spare > 0:
        costs = [
            (_narrowest(n, natural[n], taken - 1, lines) - given[n], n)
            for n in flexible
            if (taken := lines(n, given[n])) > 1
        ]
        if not costs or min(costs)[0] > spare:
            break
        cost, n = min(costs)
        given[n] += cost
        spare -= cost
    last = flexible[-1]
    given[last] += min(spare, max(0, natural[last] - given[last]))
    return [given.get(n, w) for n, w in enumerate(natural)]


def _narrowest(column: int, natural: int, most: int, lines: Callable[[int, int], int]) -> int:
    """The narrowest width at which `column` takes at most `most` lines."""
    low, high = max(1, -(-natural // most)), natural
    while low < high:
        mid = (low + high) // 2
        low, high = (low, mid) if lines(column, mid) <= most else (mid + 1, high)
    return low


def item_lines(report: dict[str, Any]) -> Iterator[str]:
    """Every item of a report, one line each (for `report`'s table): a header, then seq,
    state, attempts, id, recipient and its receipt or last error, as they are read, so a
    million items never sit in memory (page it with `| less`, or use --format csv)."""
    yield "every item (seq, state, attempts, id, to, receipt or last error):"
    unsent = _left_unsent_by(report) is not None
    for i in report["items"]:
        state = _state_label(i, unsent)
        outcome = i["receipt_id"] or i["last_error"] or ""
        yield f"{i['seq']:>7}  {state:<10}  {i['attempts']:>2}  {i['id']}  {i['to']}  {outcome}"


def _left_unsent_by(report: dict[str, Any]) -> str | None:
    """Why the reported run leaves its pending rows unsent, as the pending line words it:
    it is completed or cancelled, or "being cancelled" (its cancel asked for: no item is
    claimed once a cancel is committed, and its next resume or cancel closes it); None while
    it still sends them."""
    if RunState(report["state"]) in FINISHED_RUN_STATES:
        return str(report["state"])
    return "being cancelled" if report.get("cancel_requested_at") else None


def _state_label(item: dict[str, Any], unsent: bool) -> str:
    """An item's state as the tables show it: a pending item with why it is pending, or, in a
    run that leaves its pending rows unsent, that it is left unsent (the JSON keeps its
    `pending_kind`)."""
    if item.get("failed_kind") == FailedKind.ABANDONED:
        return "failed (abandoned, maybe delivered)"
    if item["state"] != "pending":
        return str(item["state"])
    kind = item["pending_kind"]
    if not unsent:
        return f"pending ({kind})"
    if kind == PendingKind.MAYBE_DELIVERED:
        # Not sent again by this run, but its recipient may have it: never "left unsent".
        return "pending (attempted, maybe delivered, not sent again)"
    attempted = "never attempted" if kind == PendingKind.NEVER_ATTEMPTED else "attempted"
    return f"pending ({attempted}, left unsent)"


def _render_drafts(drafts: dict[str, Any] | None, console: Console) -> None:
    """A --compose run's drafting: rows drafted, failed, to draft, tokens, batch chunks."""
    if not drafts:
        return
    console.print(
        f"drafts ({drafts['model']}): {drafts['drafted']} of {drafts['total']} drafted, "
        f"{drafts['failed']} failed, {drafts['pending']} to draft; tokens: "
        f"{drafts['input_tokens']} in, {drafts['output_tokens']} out"
    )
    chunks = drafts.get("chunks")
    if chunks:
        console.print(
            f"  chunks: {chunks['chunks']} ({chunks['done']} done, {chunks['submitted']} "
            f"submitted, {chunks['creating']} creating, {chunks['canceled']} cancelled); "
            f"batches created: {chunks['batches_created']}"
        )
    for failure in drafts["failures"]:
        console.print(f"  row {failure['seq']} (line {failure['line']}): {failure['error']}")
