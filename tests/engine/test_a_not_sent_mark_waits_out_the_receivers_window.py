"""A `not-sent` mark is the operator's own "not found": while the receiver may still commit a
request of the item (until `timeout + query_delay` after it left), nothing seen there shows
it was not sent, so `reconcile --manual` refuses the mark (exit 4, naming the moment) and the
item stays unknown. After that moment the honest marks settle the run: each key delivered
once. A webhook that can neither be asked nor dedupes (N = 1 and 8), SMTP (its window: a
timeout for each step of its session) and Apprise (a timeout to connect and one to read, for
each of its URLs in turn); both stores; the clock is moved past the window rather than
waited for."""

from __future__ import annotations

import json
import threading
from datetime import timedelta

import pytest

from notifier.domain import clock

from ..conftest import Inbox, Workspace, make_rows
from ..receiver import Receiver, receiving, webhook_config
from ..support.crashed import crash_send
from ..support.net import refusing_port
from ..support.waits import past_every_window

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(90)]


@pytest.mark.parametrize("n", [1, 8])
def test_a_not_sent_mark_inside_the_window_is_refused_and_the_honest_marks_after_it_send_once(
    ws: Workspace, n: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # u1: the receiver takes the request and holds it past the 1 s timeout (committed only
    # once released); u2: a 500, nothing taken. Both end unknown.
    held = threading.Event()
    receiver = Receiver(answer=lambda item_id, nth: 500 if (item_id, nth) == ("u2", 1) else None,
                        hold=held)  # fmt: skip
    with receiving(receiver):
        try:
            (ws.path / "notifier.toml").write_text(
                webhook_config(receiver, idempotent=False, status=False, timeout=1, query_delay=30)
            )
            ws.write_csv("batch.csv", make_rows(2))
            sent = ws.invoke("send", "batch.csv", "--channel", "hooks", "--run-id", "r1",
                             "--concurrency", str(n))  # fmt: skip
            assert sent.exit_code == 3, sent.output
            assert "`notifier reconcile --manual r1` from " in sent.output
            assert "when the receiver can no longer commit them" in sent.output
            assert {i.item_id: i.state for i in ws.ledger.items("r1")} == {
                "u1": "unknown",
                "u2": "unknown",
            }
            # Following the advice at once: the receiver holds neither key yet.
            assert receiver.commits == {}
            for item_id in ("u1", "u2"):
                early = ws.invoke("reconcile", "--manual", "r1", "--item", item_id,
                                  "--mark", "not-sent", "--evidence", "nothing there")  # fmt: skip
                assert early.exit_code == 4, early.output
                assert "may still commit" in early.output, early.output
            # The interactive prompt's [n] is refused the same way, and it goes on.
            asked = ws.invoke("reconcile", "--manual", "r1", input="n\n\nq\n")
            assert "may still commit" in asked.output, asked.output
            assert {i.state for i in ws.ledger.items("r1")} == {"unknown"}
        finally:
            held.set()  # the receiver commits what it took (u1), inside the window
        receiver.wait_for(lambda r: len(r.commits) == 1)
        past_every_window(monkeypatch)
        keys = {i.item_id: i.idempotency_key for i in ws.ledger.items("r1")}
        for item_id, key in keys.items():
            mark = "sent" if key in receiver.commits else "not-sent"
            marked = ws.invoke("reconcile", "--manual", "r1", "--item", item_id,
                               "--mark", mark, "--evidence", "the receiver's commits")  # fmt: skip
            assert marked.exit_code in (0, 3), marked.output
        resumed = ws.invoke("resume", "r1", "--concurrency", str(n))
        assert resumed.exit_code == 0, resumed.output
        receiver.wait_for(lambda r: len(r.commits) == 2)
    assert receiver.commits == dict.fromkeys(keys.values(), 1)
    report = json.loads(ws.invoke("report", "r1", "--format", "json").output)
    assert report["counts"]["sent"] == 2, report["counts"]


def test_a_not_sent_mark_on_smtp_waits_out_the_relays_timeout(
    ws: Workspace, inbox: Inbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed right after u1 went to the relay (which has it), then resumed: u1 is unknown.
    Marked not sent at once, it is refused: the relay may still take a message until every
    step of its session after the request left (MAIL, RCPT, DATA, the data with its final
    reply, each bounded by `timeout`, 30 s here) could have run out, so still two timeouts
    later; after that, the honest mark (the inbox holds it) settles the run, and every
    message is in the inbox once."""
    ws.write_csv("batch.csv", make_rows(2))
    crash_send("after-send:1", db=ws.db, channel="mail")
    resumed = ws.invoke("resume")
    assert resumed.exit_code == 3, resumed.output
    assert ws.ledger.item("u1").state == "unknown"
    early = ws.invoke("reconcile", "--manual", "--item", "u1", "--mark", "not-sent",
                      "--evidence", "not in the mailbox yet")  # fmt: skip
    assert early.exit_code == 4, early.output
    assert "may still commit" in early.output
    # Two timeouts on: the relay may still be inside its final reply's timeout.
    monkeypatch.setattr(clock, "_SHIFT", clock._SHIFT + timedelta(seconds=60))
    later = ws.invoke("reconcile", "--manual", "--item", "u1", "--mark", "not-sent",
                      "--evidence", "not in the mailbox yet")  # fmt: skip
    assert later.exit_code == 4, later.output
    assert "may still commit" in later.output
    past_every_window(monkeypatch)
    assert [m["Subject"] for m in inbox.messages].count("Hello 1") == 1
    marked = ws.invoke("reconcile", "--manual", "--item", "u1", "--mark", "sent",
                       "--evidence", "in the mailbox")  # fmt: skip
    assert marked.exit_code == 0, marked.output
    assert sorted(m["Subject"] for m in inbox.messages) == ["Hello 1", "Hello 2"]


def test_a_channel_of_the_run_that_cannot_be_built_now_holds_up_no_other_channels_mark(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run over two webhooks, one signed with a secret no longer in the environment: a
    not-sent mark of an item of the other channel, after its window, needs only its own
    channel, and is taken."""
    receiver = Receiver(answer=lambda item_id, nth: 500 if (item_id, nth) == ("u1", 1) else None)
    monkeypatch.setenv("HOOK_SECRET", "whsec_" + "QUJDREVGR0hJSktMTU5PUA==")
    with receiving(receiver):
        signed = (f'[channels.signed]\ntype = "webhook"\nurl = "{receiver.url}/notifications"\n'
                  'secret_env = "HOOK_SECRET"\n')  # fmt: skip
        (ws.path / "notifier.toml").write_text(
            signed + webhook_config(receiver, idempotent=False, status=False, timeout=1)
        )
        rows = make_rows(2)
        for row, channel in zip(rows, ("channel", "hooks", "signed"), strict=True):
            row.append(channel)
        ws.write_csv("batch.csv", rows)
        sent = ws.invoke("send", "batch.csv", "--run-id", "r1")
        assert sent.exit_code == 3, sent.output
        assert ws.ledger.item("u1", "r1").state == "unknown"
        monkeypatch.delenv("HOOK_SECRET")
        past_every_window(monkeypatch)
        marked = ws.invoke("reconcile", "--manual", "r1", "--item", "u1", "--mark", "not-sent",
                           "--evidence", "nothing there")  # fmt: skip
        assert marked.exit_code in (0, 3), marked.output
        assert ws.ledger.item("u1", "r1").state == "pending"


def test_a_not_sent_mark_on_apprise_waits_out_every_urls_timeouts(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An Apprise channel of two URLs notifies them one after the other, each connecting
    and reading within `timeout` (10 s here): the second's request may leave only once the
    first ended, and its service may commit it until its own timeouts after that. Both fail
    (unknown); a not-sent mark 15 s after the notification started is refused, and taken
    once every URL's timeouts have run out."""
    pytest.importorskip("apprise")
    with refusing_port() as dead:
        (ws.path / "notifier.toml").write_text(
            '[channels.alerts]\ntype = "apprise"\ntimeout = 10\n'
            f'urls = ["json://127.0.0.1:{dead}/a", "json://127.0.0.1:{dead}/b"]\n'
        )
        ws.write_csv("batch.csv", make_rows(1))
        sent = ws.invoke("send", "batch.csv", "--channel", "alerts", "--run-id", "r1")
        assert sent.exit_code == 3, sent.output
        assert ws.ledger.item("u1").state == "unknown"
        monkeypatch.setattr(clock, "_SHIFT", clock._SHIFT + timedelta(seconds=15))
        early = ws.invoke("reconcile", "--manual", "r1", "--item", "u1", "--mark", "not-sent",
                          "--evidence", "nothing there")  # fmt: skip
        assert early.exit_code == 4, early.output
        assert "may still commit" in early.output
        past_every_window(monkeypatch)
        marked = ws.invoke("reconcile", "--manual", "r1", "--item", "u1", "--mark", "not-sent",
                           "--evidence", "nothing there")  # fmt: skip
        assert marked.exit_code in (0, 3), marked.output
    assert ws.ledger.item("u1").state == "pending"
