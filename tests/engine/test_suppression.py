"""The suppression list end to end, through the CLI (or, for a run held mid-way, the engine
in a thread) against a real aiosmtpd relay, on SQLite and PostgreSQL, at concurrency 1 and
8: suppressed rows never reach the relay, a 5.1.1 at RCPT suppresses the address for the
next run, an address suppressed while a run is held is not sent, an item that may already
have been delivered is never called suppressed, suppressed items never make the exit code
non-zero, and on PostgreSQL the claim asks the list by its primary key."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from aiosmtpd.smtp import SMTP, Envelope, Session

from notifier.sandbox.server import Faults, Sandbox
from notifier.store.postgres import POSTGRES

from ..conftest import Workspace, make_rows, smtp_server, wait_for
from ..receiver import Receiver, receiving
from ..smtp_relay import ScriptedRelay
from ..support.background import exit_code, send_in_background
from ..support.crashed import crash_invoke
from ..support.held import WAIT_S, Answered, HeldRun

pytestmark = pytest.mark.both_stores
CONCURRENCY = [1, 8]


class Relay(ScriptedRelay):
    """The scripted relay, noting every RCPT it was asked, and able to hold every message
    at DATA until released (a run held mid-way, its senders waiting on the relay)."""

    def __init__(self) -> None:
        super().__init__()
        self.rcpts: list[str] = []
        self.held = 0
        self.release = threading.Event()
        self.release.set()

    async def handle_RCPT(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: list[str]
    ) -> str:
        self.rcpts.append(address)
        return await super().handle_RCPT(server, session, envelope, address, options)

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        self.held += 1
        while not self.release.is_set():
            await asyncio.sleep(0.01)
        return await super().handle_DATA(server, session, envelope)

    def recipients(self) -> list[str]:
        return [str(m["To"]) for m in self.messages]


@pytest.fixture
def relay(ws: Workspace) -> Any:
    handler = Relay()
    with smtp_server(ws, handler):
        yield handler


def listed_suppressions(ws: Workspace) -> list[dict[str, Any]]:
    """The list as `suppress list --format json` shows it to the operator."""
    listed = ws.invoke("suppress", "list", "--format", "json")
    assert listed.exit_code == 0, listed.output
    entries: list[dict[str, Any]] = json.loads(listed.output)["suppressions"]
    return entries


def report(ws: Workspace, *args: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(ws.invoke("report", "--format", "json", *args).output)
    return data


@pytest.mark.parametrize("n", CONCURRENCY)
def test_suppressed_rows_never_reach_the_relay_and_the_run_exits_0(
    ws: Workspace, relay: Relay, n: int
) -> None:
    """Rows whose recipient is suppressed (in any case) are planned `suppressed`, never
    reach the relay (no RCPT), are counted apart in report, status and runs, and the run
    completes with exit 0."""
    ws.write_csv("batch.csv", make_rows(20))
    added = ws.invoke("suppress", "add", "USER3@Example.com", "user7@EXAMPLE.COM",
                      "user20@example.com", "--reason", "asked to stop")  # fmt: skip
    assert added.exit_code == 0, added.output
    sent = ws.invoke("send", "batch.csv", "--channel", "mail", "--concurrency", str(n))
    assert sent.exit_code == 0, sent.output
    assert "3 of them suppressed" in sent.output and "3 suppressed" in sent.output
    suppressed = {"user3@example.com", "user7@example.com", "user20@example.com"}
    assert not suppressed & set(relay.rcpts)
    assert not suppressed & set(relay.recipients())
    assert len(relay.messages) == 17
    data = report(ws)
    assert data["state"] == "completed"
    assert (data["counts"]["sent"], data["counts"]["suppressed"]) == (17, 3)
    states = {i["to"]: i["state"] for i in data["items"]}
    assert {to for to, state in states.items() if state == "suppressed"} == suppressed
    assert ws.status()["counts"]["suppressed"] == 3
    csv_report = ws.invoke("report", "--format", "csv").output
    assert csv_report.count(",suppressed,") == 3
    assert "suppressed" in ws.invoke("runs").output
    # The intents are stored: the fingerprint covers the suppressed rows too.
    assert len(ws.ledger.items()) == 20


@pytest.mark.parametrize("n", CONCURRENCY)
def test_a_5_1_1_rcpt_rejection_suppresses_the_address_for_the_next_run(
    ws: Workspace, relay: Relay, n: int
) -> None:
    """A 550 5.1.1 to RCPT fails that item (exit 3) and puts the address on the list with
    the reply as its reason (source relay); the next send of a new file holding that
    address plans it `suppressed`, never asks the relay for it, and exits 0."""
    relay.rcpt_answers["user4@example.com"] = "550 5.1.1 <user4@example.com>: no such user"
    ws.write_csv("first.csv", make_rows(10))
    first = ws.invoke("send", "first.csv", "--channel", "mail", "--concurrency", str(n))
    assert first.exit_code == 3, first.output
    assert report(ws)["counts"]["failed"] == 1
    listed = json.loads(ws.invoke("suppress", "list", "--format", "json").output)
    [entry] = listed["suppressions"]
    assert entry["address"] == "user4@example.com" and entry["source"] == "relay"
    assert "550 5.1.1" in entry["reason"] and "no such user" in entry["reason"]
    assert ws.ledger.suppression_audit() == [("add", "user4@example.com", "relay")]
    asked = relay.rcpts.count("user4@example.com")
    # A new file (other ids, other content) that holds the rejected address again.
    rows = make_rows(10, start=101)
    rows[3][1] = "User4@Example.com"
    ws.write_csv("second.csv", rows)
    second = ws.invoke("send", "second.csv", "--channel", "mail", "--concurrency", str(n))
    assert second.exit_code == 0, second.output
    data = report(ws)
    assert (data["counts"]["sent"], data["counts"]["suppressed"]) == (9, 1)
    assert relay.rcpts.count("user4@example.com") == asked
    assert relay.rcpts.count("User4@example.com") == 0


def test_suppress_on_reject_false_leaves_the_list_alone(ws: Workspace) -> None:
    """With `suppress_on_reject = false` the rejected item still fails, but the address is
    not put on the list."""
    handler = Relay()
    handler.rcpt_answers["user2@example.com"] = "550 5.1.1 no such user"
    with smtp_server(ws, handler, "suppress_on_reject = false\n"):
        ws.write_csv("batch.csv", make_rows(3))
        sent = ws.invoke("send", "batch.csv", "--channel", "mail")
    assert sent.exit_code == 3, sent.output
    assert report(ws)["counts"]["failed"] == 1
    assert listed_suppressions(ws) == []


@pytest.mark.parametrize("n", CONCURRENCY)
def test_an_address_suppressed_while_the_run_is_held_is_not_sent(
    ws: Workspace, relay: Relay, n: int
) -> None:
    """The relay holds the first n messages (every sender waits on it); meanwhile `suppress
    add` puts later rows' recipients on the list; released, the run never sends them (the
    claim checks the list), marks them suppressed, and exits 0."""
    relay.release.clear()
    ws.write_csv("batch.csv", make_rows(20))
    # The engine in a thread of this process: the list is read at the claim, whoever adds.
    sending = send_in_background(ws, "mail", n)
    try:
        wait_for(lambda: relay.held >= n or sending.done(), f"{n} messages held at the relay")
        late = [f"user{i}@example.com" for i in (15, 17, 20)]
        added = ws.invoke("suppress", "add", *late, "--reason", "complained mid-run")
        assert added.exit_code == 0, added.output
    finally:
        relay.release.set()
    result = sending.result()
    assert exit_code(result) == 0, result
    assert not set(late) & set(relay.rcpts)
    data = report(ws)
    assert (data["counts"]["sent"], data["counts"]["suppressed"]) == (17, 3)
    assert {i["to"] for i in data["items"] if i["state"] == "suppressed"} == set(late)


@pytest.mark.timeout(60)
def test_an_address_suppressed_mid_run_gets_only_the_requests_already_under_way(
    ws: Workspace,
) -> None:
    """At N = 8 with 3N claimed ahead, every item to one address: `suppress add` commits
    while the first N requests are under way. Once the committer has looked at the list
    (at most every 0.2 s while sends are in flight), the senders that free up start none
    of the 3N queued items: only the N already under way reach the address; the others
    are released never attempted and end suppressed."""
    n = 8
    channel = Answered()
    run = HeldRun(ws, channel, n, 4 * n, hold=False, to="ann@example.com")
    run.thread.start()
    try:
        channel.wait_started(n)
        added = ws.invoke("suppress", "add", "ann@example.com", "--reason", "complained")
        assert added.exit_code == 0, added.output
        queued = {seq for seq in range(1, 4 * n + 1)} - {int(i) for i, _ in channel.started}
        wait_for(
            lambda: run.runner.dispatch.suppressed_seen >= queued,
            "the committer's look at the list",
            WAIT_S,
        )
        channel.let_all_go()
        run.wait_taken(4 * n)
    finally:
        result = run.finish(channel)
    assert len(channel.started) == n
    assert result.stop.value == "completed", result
    assert ws.ledger.state_counts() == {"sent": n, "suppressed": 3 * n}


def test_cancel_report_counts_suppressed_apart(ws: Workspace, relay: Relay) -> None:
    """A run planned for approval and cancelled: `cancel --report` counts its suppressed
    rows apart from the pending ones (which will never be sent: exit 3)."""
    ws.write_csv("batch.csv", make_rows(5))
    assert ws.invoke("suppress", "add", "user1@example.com").exit_code == 0
    planned = ws.invoke("send", "batch.csv", "--channel", "mail", "--require-approval")
    assert planned.exit_code == 0, planned.output
    cancelled = ws.invoke("cancel", "--report", "--format", "json")
    assert cancelled.exit_code == 3, cancelled.output
    counts = json.loads(cancelled.output[cancelled.output.index("{") :])["counts"]
    assert (counts["pending"], counts["suppressed"], counts["sent"]) == (4, 1, 0)
    assert relay.rcpts == []


def test_a_cancelled_run_of_sent_and_suppressed_items_exits_0(ws: Workspace) -> None:
    """Cancel's exit code counts suppressed items as settled, like sent ones."""
    ws.write_csv("batch.csv", make_rows(3))
    assert ws.invoke("suppress", "add", *[f"user{i}@example.com" for i in (1, 2, 3)]).exit_code == 0
    planned = ws.invoke("send", "batch.csv", "--require-approval")
    assert planned.exit_code == 0, planned.output
    cancelled = ws.invoke("cancel")
    assert cancelled.exit_code == 0, cancelled.output


@pytest.mark.parametrize("n", CONCURRENCY)
def test_suppressed_rows_never_reach_a_webhook(ws: Workspace, n: int) -> None:
    """On a webhook channel (items claimed ahead of the senders at N = 8) a row whose
    recipient is suppressed is never posted: the sandbox commits only the other keys."""
    with Sandbox(faults=Faults(latency_ms=5)) as sandbox:
        (ws.path / "notifier.toml").write_text(
            f'[channels.hooks]\ntype = "webhook"\nurl = "{sandbox.notifications_url}"\n'
            f'status_url = "{sandbox.url}/notifications/{{key}}"\nidempotent = true\n'
        )
        ws.write_csv("batch.csv", make_rows(30))
        suppressed = [f"user{i}@example.com" for i in (2, 9, 10, 30)]
        assert ws.invoke("suppress", "add", *suppressed).exit_code == 0
        sent = ws.invoke("send", "batch.csv", "--channel", "hooks", "--concurrency", str(n))
        assert sent.exit_code == 0, sent.output
        committed = {k for k, v in sandbox.stats()["keys"].items() if v["commits"]}
    keys = {item.target: item.idempotency_key for item in ws.ledger.items()}
    assert committed == {k for to, k in keys.items() if to not in suppressed}
    assert ws.status()["counts"]["suppressed"] == 4


def test_removed_from_the_list_the_same_file_sends_the_row(ws: Workspace, relay: Relay) -> None:
    """A row suppressed in one run is not delivered, so once its address is removed from
    the list, sending the same file again sends exactly that row (and nothing twice)."""
    ws.write_csv("batch.csv", make_rows(5))
    assert ws.invoke("suppress", "add", "user5@example.com").exit_code == 0
    assert ws.invoke("send", "batch.csv", "--channel", "mail").exit_code == 0
    assert "user5@example.com" not in relay.rcpts and len(relay.messages) == 4
    again = ws.invoke("send", "batch.csv", "--channel", "mail")
    assert again.exit_code == 0, again.output  # still suppressed: planned so again
    assert "user5@example.com" not in relay.rcpts
    assert ws.invoke("suppress", "remove", "User5@Example.com").exit_code == 0
    last = ws.invoke("send", "batch.csv", "--channel", "mail")
    assert last.exit_code == 0, last.output
    assert relay.rcpts.count("user5@example.com") == 1 and len(relay.messages) == 5


def test_a_kill_right_after_the_rejection_is_recorded_keeps_the_suppression(
    ws: Workspace, relay: Relay
) -> None:
    """kill -9 right after the commit that recorded a 5.1.1 failure: the failure and the
    suppression were one transaction, so both are there; resume finishes the run without
    asking the relay for that address again."""
    relay.rcpt_answers["user4@example.com"] = "550 5.1.1 no such user"
    ws.write_csv("batch.csv", make_rows(8))
    crash_invoke(ws, "after-receipt:4", "send", "batch.csv", "--channel", "mail")
    assert ws.ledger.item("u4").state == "failed"
    assert [(e["address"], e["source"]) for e in listed_suppressions(ws)] == [
        ("user4@example.com", "relay")
    ]
    resumed = ws.invoke("resume")
    assert resumed.exit_code == 3, resumed.output  # the one failed item
    assert relay.rcpts.count("user4@example.com") == 1
    assert (ws.status()["counts"]["sent"], len(relay.messages)) == (7, 7)


def test_a_non_ascii_capital_is_matched_at_the_claim(ws: Workspace) -> None:
    """`ünal@…` suppressed, the row to `ÜNAL@…`: SQL (ASCII lower-casing only) does not
    match it at plan time, the claim's check in Python does, so it is never sent."""
    ws.write_csv("batch.csv", [["id", "to", "subject", "body"], ["1", "ÜNAL@example.com", "s", "b"],
                               ["2", "eve@example.com", "s", "b"]])  # fmt: skip
    assert ws.invoke("suppress", "add", "ünal@Example.com").exit_code == 0
    sent = ws.invoke("send", "batch.csv")
    assert sent.exit_code == 0, sent.output
    assert [d["item_id"] for d in ws.outbox_documents()] == ["2"]
    assert [(i.seq, i.state) for i in ws.ledger.items()] == [(1, "suppressed"), (2, "sent")]


@pytest.mark.parametrize("n", CONCURRENCY)
@pytest.mark.parametrize(
    ("listed", "written"),
    [("ann@bücher.example", "ann@xn--bcher-kva.example"),
     ("ann@XN--BCHER-KVA.example", "ann@Bücher.example"),
     ("ann@straße.example", "ann@xn--strae-oqa.example"),
     ("ann@bücher.xn--caf-dma.example", "ann@Bücher.Café.example")],
    ids=["unicode-listed", "punycode-listed", "idna-2008-punycode-written", "mixed"],
)  # fmt: skip
def test_an_internationalised_domain_is_one_address_in_either_spelling(
    ws: Workspace, relay: Relay, n: int, listed: str, written: str
) -> None:
    """`ann@bücher.example` goes on the wire as `ann@xn--bcher-kva.example`: one mailbox.
    Suppressed in one spelling, a row written in the other (and in other case) is suppressed
    at the claim, among others claimed ahead at N = 8, and never reaches the relay."""
    rows = make_rows(12)
    rows[5][1] = written
    ws.write_csv("batch.csv", rows)
    assert ws.invoke("suppress", "add", listed).exit_code == 0
    sent = ws.invoke("send", "batch.csv", "--channel", "mail", "--concurrency", str(n))
    assert sent.exit_code == 0, sent.output
    assert not any(written.lower() in r.lower() or "bcher" in r.lower() for r in relay.rcpts)
    assert len(relay.messages) == 11
    states = {i.item_id: i.state for i in ws.ledger.items()}
    assert states["u5"] == "suppressed" and set(states.values()) == {"sent", "suppressed"}


@pytest.fixture
def receiver(ws: Workspace) -> Iterator[Receiver]:
    with receiving(Receiver()) as running:
        yield running


def test_the_claims_suppression_probe_uses_the_lists_primary_key(ws: Workspace) -> None:
    """On PostgreSQL each claimed row asks the list by its primary key, not by a full scan."""
    if not ws.url:
        pytest.skip("PostgreSQL: SQLite's LOWER(TRIM()) needs no collation")
    listed = ws.write_csv(
        "bounced.csv", [["address"], *([f"bounced{i}@example.net"] for i in range(20_000))]
    )
    imported = ws.invoke("suppress", "import", str(listed))
    assert imported.exit_code == 0, imported.output
    with psycopg.connect(ws.url, autocommit=True) as pg:
        pg.execute("ANALYZE suppressions")
        probe = POSTGRES.address_of.format("'User1@Example.com'")
        plan = "\n".join(
            row[0]
            for row in pg.execute(
                f"EXPLAIN SELECT EXISTS (SELECT 1 FROM suppressions s WHERE s.address = {probe})"
            )
        )
    assert "suppressions_pkey" in plan, plan
