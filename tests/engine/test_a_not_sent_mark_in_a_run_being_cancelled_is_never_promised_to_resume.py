"""A run whose cancel was asked for but not finished (a cancel without the audit key refused
with exit 4 after the worker was killed: its flag stays set) is closed as cancelled by the
next `resume` or `cancel`, which send nothing more. An item marked not sent by hand in that
run is never promised to `resume` ("it will be sent with the same key on resume": followed,
that sends nothing and the row reaches nobody); the mark and `status` say the run is being
cancelled, and the mark's advice, followed word for word, delivers every row once. Both
stores."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from notifier import config
from notifier.api import settling, working
from notifier.api.env import Env, open_store
from notifier.cli.manual import marked_message
from notifier.domain.chain import KEY_ENV
from notifier.store import target

from ..conftest import Workspace, make_rows
from ..receiver import Receiver, receiving, webhook_config
from ..support.audited import KEY
from ..support.crashed import crash_send
from ..support.waits import past_every_window

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(120)]


@contextmanager
def killed_with_u2_unknown(ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    """Run r1 of three rows, keyed, to a receiver that can neither dedupe nor be asked,
    killed once u2's attempt was recorded and before its request left, then settled by
    `reconcile`: u1 delivered, u2 unknown, u3 never attempted; the receiver's window past."""
    monkeypatch.setenv(KEY_ENV, KEY)
    receiver = Receiver()
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(receiver, idempotent=False, status=False, timeout=1)
        )
        ws.write_csv("batch.csv", make_rows(3))
        crash_send("after-intent:2", db=ws.db, channel="hooks", run_id="r1")
        assert receiver.deliveries() == {"u1": 1}
        settled = ws.invoke("reconcile", "r1")  # the channel cannot be asked: unknown
        assert ws.ledger.item("u2").state == "unknown", settled.output
        past_every_window(monkeypatch)
        yield receiver


def test_a_not_sent_mark_after_a_refused_cancel_is_not_promised_to_resume(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    with killed_with_u2_unknown(ws, monkeypatch) as receiver:
        keyless = ws.invoke("cancel", "r1", env={KEY_ENV: ""})
        assert keyless.exit_code == 4, keyless.output  # the flag is set, the run not closed
        assert ws.ledger.run("r1").cancel_requested_at is not None
        marked = ws.invoke("reconcile", "r1", "--manual", "--item", "u2", "--mark", "not-sent",
                           "--evidence", "never reached the gateway")  # fmt: skip
        assert marked.exit_code in (0, 3), marked.output
        said = marked.output
        # Every report of the run says so too: nothing of it waits to be retried.
        status = ws.invoke("status", "r1").output
        assert "waiting to retry" not in status, status
        assert "the run is being cancelled: none of them is sent by this run" in status, status
        assert "cancel: asked for at " in status, status
        assert "will be sent with the same key on resume" not in said, said
        assert "run r1 is being cancelled, so it will not send it" in said, said
        # Followed word for word: close the run, then send the same file again.
        for command in re.findall(r"`notifier ([^`]+)`", said):
            followed = ws.invoke(*shlex.split(command))
            # `cancel` exits 3 for the row it leaves unsent; the send delivers it.
            assert followed.exit_code in (0, 3), (command, followed.output)
        assert ws.ledger.run("r1").state == "cancelled"
    assert receiver.deliveries() == {"u1": 1, "u2": 1, "u3": 1}


def test_a_mark_recorded_after_a_cancel_was_asked_for_words_the_run_as_it_is_then(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The interactive `reconcile --manual` reads the run before its first question and
    records the answer later: a cancel asked for in between (here one refused without the
    key after a kill) is what the mark's message words, not the run as first read."""
    with killed_with_u2_unknown(ws, monkeypatch):
        env = Env(
            target.parse(ws.db), config.load(ws.path / "notifier.toml", explicit=False), say=print
        )
        store = open_store(env)
        try:
            asked = store.core.get_run("r1")  # as the prompt read it
            assert asked.cancel_requested_at is None
            keyless = ws.invoke("cancel", "r1", env={KEY_ENV: ""})
            assert keyless.exit_code == 4, keyless.output  # the flag is set, the run open
            with working.take_lease(store, asked, env.config.lease_ttl_s) as lease:
                marked = settling.decide_by_hand(
                    env, store, asked, "u2", "not-sent", "never reached the gateway",
                    lease.version,
                )  # fmt: skip
        finally:
            store.close()
    said = marked_message(marked)
    assert "will be sent with the same key on resume" not in said, said
    assert "run r1 is being cancelled, so it will not send it" in said, said
