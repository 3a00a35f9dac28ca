"""A file whose rows SEVERAL finished runs left unsettled (unknown) is refused, naming every
one of those runs ("may have been delivered by finished runs A, B"). Its advice, followed
word for word, must settle them all so that the file can be sent again: advice that names
only the newest run settles its rows, and the file is refused again over the older run's.
Each run here is a plain send through a receiver that can neither dedupe nor be asked, whose
first answer to one row per run is a 500 (the run cancelled with that row unknown); the
operator marks each not-sent, answering the manual prompt, after the receiver's window.
Both stores."""

from __future__ import annotations

import re
import shlex
from datetime import timedelta

import pytest

from notifier.domain import clock

from ..conftest import Workspace
from ..receiver import Receiver, receiving, webhook_config

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(120)]

HEADER = ["id", "to", "subject", "body"]
ROWS = {i: [f"u{i}", f"user{i}@example.com", f"S{i}", f"B{i}"] for i in (1, 2, 3)}


def test_the_refusal_over_rows_left_unsettled_by_two_runs_lets_the_file_go_once_followed(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    receiver = Receiver(answer=lambda item, nth: 500 if nth == 1 and item in ("u1", "u3") else None)
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(receiver, idempotent=False, status=False, timeout=1)
        )
        ws.write_csv("a.csv", [HEADER, ROWS[1], ROWS[2]])
        ws.write_csv("b.csv", [HEADER, ROWS[3]])
        ws.write_csv("both.csv", [HEADER, ROWS[1], ROWS[3]])
        for name, run_id in (("a.csv", "A"), ("b.csv", "B")):
            sent = ws.invoke("send", name, "--channel", "hooks", "--run-id", run_id)
            assert sent.exit_code == 3, sent.output
            cancelled = ws.invoke("cancel", run_id)
            assert cancelled.exit_code in (0, 3), cancelled.output
        assert ws.ledger.item("u1").state == ws.ledger.item("u3").state == "unknown"
        # An hour on: the receiver's window for both is over, so not-sent marks are taken.
        monkeypatch.setattr(clock, "_SHIFT", clock._SHIFT + timedelta(hours=1))

        refused = ws.invoke("send", "both.csv", "--channel", "hooks")
        assert refused.exit_code == 2, refused.output
        assert "finished runs A, B" in refused.output, refused.output
        # Followed word for word: every command it names, in order; each manual prompt
        # answered "not sent" (the operator checked: nothing arrived).
        for command in re.findall(r"`notifier ([^`]+)`", refused.output):
            followed = ws.invoke(*shlex.split(command), input="n\nnothing arrived\n" * 4)
            assert followed.exit_code in (0, 3), (command, followed.output)
        again = ws.invoke("send", "both.csv", "--channel", "hooks")
        assert again.exit_code == 0, (
            f"the file is refused again after following the advice:\n{refused.output}\n"
            f"{again.output}"
        )
    assert receiver.deliveries() == {"u1": 1, "u2": 1, "u3": 1}
