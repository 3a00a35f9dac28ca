"""A conflict halts a shared PostgreSQL run for every worker with the same exit code: the one
that met it, the others still sending it, and one that joins the halted run afterwards all
exit 4 (refused for safety), never 3, as a single process meeting it does. Real processes."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from ..conftest import make_rows, wait_for
from ..engine.test_every_concurrency import CONCURRENCY, _assert_nothing_left_open, _run_state
from ..receiver import Receiver
from ..support.shared_runs import shared_run
from .test_kills_and_signals_at_every_concurrency import _holders


class _OneConflict:
    """Answers 422 (another intent holds the key) to the first POST that arrives once
    `armed` is set, and nothing else: exactly one worker meets the conflict."""

    def __init__(self) -> None:
        self.armed = threading.Event()
        self.lock = threading.Lock()
        self.item: str | None = None

    def __call__(self, item_id: str, _n: int) -> int | None:
        with self.lock:
            if self.armed.is_set() and self.item is None:
                self.item = item_id
                return 422
        return None


@CONCURRENCY
@pytest.mark.timeout(120)
def test_every_worker_of_a_run_halted_for_a_conflict_exits_4(
    tmp_path: Path, postgres_server: str, monkeypatch: pytest.MonkeyPatch, n: int
) -> None:
    """Two workers (N = 1 and 8) both holding items in flight; one POST is answered 422. The
    worker that got it halts the run for the conflict (exit 4); the other, which finds the
    run halted by another worker, ends by the cause stored with the halt: exit 4 too, saying
    it was a conflict. A `worker` joining the halted run afterwards sends nothing and exits 4."""
    conflict, hold = _OneConflict(), threading.Event()
    receiver = Receiver(answer=conflict, hold=hold)
    with shared_run(
        tmp_path, postgres_server, receiver, idempotent=True, status=True, timeout=30
    ) as ws:
        ws.write_csv("batch.csv", make_rows(200))
        first = ws.popen("send", "batch.csv", "--channel", "hooks", "--run-id", "shared",
                         "--concurrency", str(n))  # fmt: skip
        second = None
        try:
            wait_for(lambda: _holders(ws) >= 1, "the first worker sending")
            second = ws.popen("worker", "shared", "--concurrency", str(n))
            wait_for(lambda: _holders(ws) == 2, "both workers holding items")
            conflict.armed.set()  # the next POST to arrive, from either worker, meets it
            hold.set()
            outcomes = [process.communicate(timeout=60) for process in (first, second)]
        finally:
            hold.set()
            for process in (first, second):
                if process is not None and process.poll() is None:
                    process.kill()
                    process.communicate()
        assert conflict.item is not None, outcomes
        assert _run_state(ws) == "halted", outcomes
        assert [first.returncode, second.returncode] == [4, 4], outcomes
        for out, _ in outcomes:
            assert "conflict" in out, out
        _assert_nothing_left_open(ws)
        # A worker joining later does not undo the halt, and ends as it says.
        arrived = len(receiver.arrivals)
        monkeypatch.chdir(tmp_path)  # the late worker in-process reads this notifier.toml
        late = ws.invoke("worker", "shared", "--concurrency", str(n))
        assert late.exit_code == 4, late.output
        assert "conflict" in late.stdout, late.output
        assert _run_state(ws) == "halted"
        assert len(receiver.arrivals) == arrived
