"""A receipts database restored from a copy taken before a run sent (a backup put back
after a disk failure) no longer knows what the run delivered. Resumed, each item's first
attempt is answered by the idempotent receiver as a replay of the request it committed under
the same key. No attempt of ours explains that replay, so it proves neither a delivery nor
its absence: the item is left unknown (maybe delivered), never sent, never failed, and the
run halts as for a conflict (exit 4). Followed as the halted run advises, nothing is ever
delivered twice: the same file sent again is refused while those rows are unsettled, and
once they are settled (by hand where the channel cannot be asked, by `reconcile` where it
can) each row stays delivered once. SQLite (a copy of the file restored)."""

from __future__ import annotations

import re
import shlex
import shutil

import pytest
from click.testing import Result

from notifier.sandbox.server import Sandbox

from ..conftest import Workspace, make_rows

pytestmark = [pytest.mark.timeout(120)]

ROWS = 3


def _commands(said: str) -> list[str]:
    """Every command the output names, as printed (between backticks)."""
    return re.findall(r"`(notifier [^`]+)`", said)


def _invoke(ws: Workspace, command: str) -> Result:
    return ws.invoke(*shlex.split(command)[1:])


@pytest.mark.parametrize("settled_by", ["hand", "query"])
def test_a_restored_database_followed_as_advised_sends_no_row_twice(
    ws: Workspace, settled_by: str
) -> None:
    with Sandbox() as sandbox:
        status_url = (
            f'status_url = "{sandbox.url}/notifications/{{key}}"\n' if settled_by == "query" else ""
        )
        (ws.path / "notifier.toml").write_text(
            f'[channels.hooks]\ntype = "webhook"\nurl = "{sandbox.notifications_url}"\n'
            "idempotent = true\n" + status_url
        )
        ws.write_csv("b.csv", make_rows(ROWS))
        planned = ws.invoke(
            "send", "b.csv", "--channel", "hooks", "--run-id", "r1", "--require-approval"
        )
        assert planned.exit_code == 0, planned.output
        fingerprint = re.search(r"fingerprint: (sha256:[0-9a-f]+)", planned.output)
        assert fingerprint is not None, planned.output
        assert ws.invoke("approve", "r1", "--fingerprint", fingerprint[1]).exit_code == 0
        shutil.copy(ws.db_file, ws.path / "backup.db")  # approved, nothing sent
        sent = ws.invoke("resume", "r1")
        assert sent.exit_code == 0, sent.output
        assert sandbox.stats()["totals"]["commits"] == ROWS
        # The disk is lost; the backup is put back.
        shutil.copy(ws.path / "backup.db", ws.db_file)
        for extra in ("receipts.db-wal", "receipts.db-shm"):
            (ws.path / extra).unlink(missing_ok=True)

        halted = ws.invoke("resume", "r1")
        said = halted.output
        assert halted.exit_code == 4, said
        assert ws.ledger.run("r1").state == "halted", said
        states = ws.ledger.states()
        replayed = [item for item, state in states.items() if state != "pending"]
        assert replayed and all(states[item] == "unknown" for item in replayed), states
        assert ws.status()["counts"]["sent"] == 0
        assert ws.ledger.receipt_count() == 0
        for item in replayed:
            error = ws.ledger.item(item).last_error or ""
            assert "replay" in error and "restored" in error, error
        # The advice names how the unknown rows get settled.
        assert "notifier reconcile r1" in said or "notifier reconcile --manual r1" in said, said

        # The file sent again exactly as printed: refused while those rows are unsettled,
        # nothing planned, nothing sent.
        again = [c for c in _commands(said) if c.startswith("notifier send ")]
        assert len(again) == 1, said
        refused = _invoke(ws, again[0])
        assert refused.exit_code == 2, refused.output
        assert [run.run_id for run in ws.ledger.runs()] == ["r1"]
        assert sandbox.stats()["totals"]["commits"] == ROWS

        # Its unknown rows settled as the halted run advises (by hand, with evidence, where
        # the channel cannot be asked; else by query), then `resume` as it advises, until
        # the run is finished: the next row's replay halts it again each time.
        for _ in range(ROWS + 1):
            if ws.ledger.run("r1").state == "completed":
                break
            unknown = [i for i, state in ws.ledger.states().items() if state == "unknown"]
            if settled_by == "hand":
                assert "notifier reconcile --manual r1" in said, said
                for item in unknown:
                    marked = ws.invoke(
                        "reconcile", "r1", "--manual", "--item", item, "--mark", "sent",
                        "--evidence", "the receiver holds a delivery under this key",
                    )  # fmt: skip
                    assert marked.exit_code in (0, 3), marked.output
            else:
                assert "notifier reconcile r1" in said, said
                reconciled = ws.invoke("reconcile", "r1")
                assert reconciled.exit_code in (0, 3), reconciled.output
            assert sandbox.stats()["totals"]["commits"] == ROWS
            if ws.ledger.run("r1").state == "completed":
                break
            assert "notifier resume r1" in said, said
            resumed = ws.invoke("resume", "r1")
            said = resumed.output
            if ws.ledger.run("r1").state != "completed":  # the next row replayed: halted
                assert resumed.exit_code == 4, said
                assert list(ws.ledger.states().values()).count("unknown") == 1, said
        assert ws.ledger.run("r1").state == "completed", said
        assert set(ws.ledger.states().values()) == {"sent"}

        # Sent again once finished: every row delivered already, nothing sent.
        nothing = _invoke(ws, again[0])
        assert nothing.exit_code == 0, nothing.output
        assert [run.run_id for run in ws.ledger.runs()] == ["r1"]
        totals = sandbox.stats()["totals"]
        assert totals["commits"] == ROWS, totals
