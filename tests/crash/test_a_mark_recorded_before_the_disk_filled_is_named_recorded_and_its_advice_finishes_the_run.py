"""`reconcile --manual --item … --mark …` writes the operator's decision, then, in writes of
their own, closes the run once nothing is left to settle (or brings its stop reason up to
date). A disk that fills between the two has recorded the decision and not what follows:
the message must say the decision stands, never that nothing was recorded, and the
commands it suggests, run as printed once there is room, must finish what the command was
doing (a run left `paused` with nothing left to send is closed), each refused by none of
them, with nothing sent twice. SQLite, the database on a disk of its own."""

from __future__ import annotations

import re
import shlex
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from notifier.api import settling
from notifier.domain import clock

from ..conftest import Workspace, make_rows
from ..receiver import Receiver, receiving, webhook_config
from ..support.disks import fill, notifier, tmpfs
from ..support.ledger import Ledger

pytestmark = pytest.mark.timeout(120)

_DECISION = {"sent": "mark_sent", "abandon": "abandon", "not-sent": "mark_not_sent"}


def _reader(db: Path) -> Callable[[str, Sequence[Any]], list[tuple[Any, ...]]]:
    """Reads of `db` (read-only), as an operator's sqlite3 makes them."""

    def query(sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            return [tuple(r) for r in conn.execute(sql, params)]
        finally:
            conn.close()

    return query


@pytest.fixture
def small_disk(ws: Workspace) -> Iterator[Path]:
    """A 4 MiB tmpfs for the database alone (root on Linux; skipped elsewhere)."""
    yield from tmpfs(ws, "4m")


def _fills_first(disk: Path, fillers: list[Path], real: Callable[..., Any]) -> Callable[..., Any]:
    """`real`, called once the disk is full: the decision is committed, the next write fails."""

    def full_then_real(*args: Any, **kwargs: Any) -> Any:
        if not fillers:
            fillers.append(fill(disk))
        return real(*args, **kwargs)

    return full_then_real


@pytest.mark.parametrize("mark", ["sent", "abandon", "not-sent"])
def test_a_mark_the_full_disk_cut_short_after_it_was_recorded_says_so_and_its_advice_finishes(
    ws: Workspace, small_disk: Path, monkeypatch: pytest.MonkeyPatch, mark: str
) -> None:
    """Run r1 of three rows, u2 unknown (its one request answered 500, nothing committed;
    the receiver can neither dedupe nor be asked). The mark of u2 is committed, then the
    disk fills before the run is closed: exit 3 naming the full disk, saying the decision
    was recorded, never that nothing was. With room again, every command the message
    suggests, as printed, is refused by none (never exit 2 or 4), the decision is recorded
    once, a run with nothing left is completed, verify holds, and no row reached the
    receiver twice."""
    db = small_disk / "receipts.db"
    receiver = Receiver(answer=lambda item_id, nth: 500 if (item_id, nth) == ("u2", 1) else None)
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(receiver, idempotent=False, status=False, timeout=1)
        )
        ws.write_csv("batch.csv", make_rows(3))
        sent = notifier(db, "send", "batch.csv", "--channel", "hooks", "--run-id", "r1")
        assert sent.exit_code == 3, sent.output
        # Past the receiver's window for u2: a not-sent mark is taken.
        monkeypatch.setattr(clock, "_SHIFT", clock._SHIFT + timedelta(hours=1))
        fillers: list[Path] = []
        real = settling.complete_if_done
        monkeypatch.setattr(settling, "complete_if_done", _fills_first(small_disk, fillers, real))
        marked = notifier(db, "reconcile", "--manual", "r1", "--item", "u2", "--mark", mark,
                          "--evidence", "checked the gateway log")  # fmt: skip
        monkeypatch.setattr(settling, "complete_if_done", real)
        assert fillers, "the mark never reached the run's closing"
        fillers[0].unlink()
        said = marked.stderr
        assert marked.exit_code == 3, marked.output
        assert "full" in said and "Traceback" not in said and "internal error" not in said
        assert len(said.strip().splitlines()) == 1, said
        assert "not recorded" not in said, said
        assert "recorded" in said, said

        for command in re.findall(r"`notifier ([^`]+)`", said):
            followed = notifier(db, *shlex.split(command))
            assert followed.exit_code in (0, 3), (command, followed.output)
        if "run the same command again" in said:
            again = notifier(db, "reconcile", "--manual", "r1", "--item", "u2", "--mark", mark,
                             "--evidence", "checked the gateway log")  # fmt: skip
            assert again.exit_code in (0, 3), again.output

        decisions = Ledger(_reader(db)).decisions("r1")
        assert [(seq, what) for seq, what, _ in decisions] == [(2, _DECISION[mark])], decisions
        status = notifier(db, "status", "r1", "--json")
        if mark != "not-sent":
            assert '"state": "completed"' in status.stdout, status.stdout
        assert notifier(db, "verify", "r1").exit_code == 0
        assert all(n == 1 for n in receiver.deliveries().values()), receiver.deliveries()
