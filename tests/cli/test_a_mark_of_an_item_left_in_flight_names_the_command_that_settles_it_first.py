"""A mark by hand of an item a killed process left IN FLIGHT (its request may have reached
the receiver; nothing settled it yet) is refused, exit 2: only an unknown item is settled by
hand. The refusal names the command that settles an in-flight item first, by asking the
receiver under its key; followed word for word, it settles the item, and the run then
finishes with every row delivered once (the one in flight was delivered before the kill: a
not-sent mark taken then would have sent it twice). Both stores: a single process crashed
at the point leaves its item in flight on either; at concurrency 1, and at 8 with items
claimed ahead (several in flight at once, the marked one among them)."""

from __future__ import annotations

import re
import shlex

import pytest

from ..conftest import Workspace
from ..receiver import Receiver, receiving, webhook_config
from ..support.crashed import crash_send

pytestmark = [pytest.mark.both_stores]

ROWS = 40  # more than N + 3N: items are claimed ahead at N = 8


@pytest.mark.timeout(90)
@pytest.mark.parametrize("concurrency", [1, 8])
def test_a_mark_of_an_item_in_flight_names_the_settling_command_and_following_it_sends_once(
    ws: Workspace, concurrency: int
) -> None:
    receiver = Receiver()
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(receiver, idempotent=True, status=True)
        )
        rows = [["id", "to", "subject", "body"]]
        rows += [[f"u{i}", f"user{i}@example.com", f"S{i}", f"B{i}"] for i in range(1, ROWS + 1)]
        batch = ws.write_csv("b.csv", rows)
        # Crashed once a request was delivered, its answer never recorded.
        crash_send("after-send:1", batch, db=ws.db, channel="hooks", run_id="r1",
                   concurrency=concurrency)  # fmt: skip
        in_flight = [i.item_id for i in ws.ledger.items() if i.state == "in_flight"]
        left = len(in_flight)
        assert left >= concurrency, in_flight  # at 8, items claimed ahead are in flight too
        delivered = [item for item in in_flight if item in receiver.deliveries()]
        assert delivered, (in_flight, receiver.deliveries())
        item = delivered[0]

        marked = ws.invoke(
            "reconcile", "r1", "--manual", "--item", item, "--mark", "not-sent",
            "--evidence", "not in the receiver's inbox",
        )  # fmt: skip
        assert marked.exit_code == 2, marked.output
        assert "is in_flight, not unknown" in marked.output, marked.output
        advised = re.findall(r"`(notifier [^`]*)`", marked.output)
        assert advised, f"no command named:\n{marked.output}"
        assert advised[0] == "notifier reconcile r1", marked.output
        assert ws.ledger.state_counts().get("in_flight", 0) == left, "the refusal changed nothing"

        # Followed word for word: the item is settled by asking, never sent again.
        followed = ws.invoke(*shlex.split(advised[0])[1:])
        assert followed.exit_code in (0, 3), followed.output
        assert ws.ledger.state_counts().get("in_flight", 0) == 0, followed.output
        again = ws.invoke(
            "reconcile", "r1", "--manual", "--item", item, "--mark", "not-sent",
            "--evidence", "not in the receiver's inbox",
        )  # fmt: skip
        assert again.exit_code == 2 and "is sent, not unknown" in again.output, again.output

        resumed = ws.invoke("resume", "r1")
        assert resumed.exit_code == 0, resumed.output
    assert receiver.deliveries() == {f"u{i}": 1 for i in range(1, ROWS + 1)}
    assert ws.ledger.state_counts() == {"sent": ROWS}
    verified = ws.invoke("verify")
    assert verified.exit_code == 0, verified.output
