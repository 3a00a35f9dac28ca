"""A stateful property test: hypothesis drives random sequences of send,
SIGKILL at a random moment, resume, cancel (with and without a live worker), reconcile by
query and honest manual marks against two sandboxes with faults on; after every step the
database, the report and what the sandboxes committed must agree.

Three webhook channels share the batch: `idem` (idempotent, queryable), `plain` (not
idempotent, queryable) and `blind` (neither: its doubtful items become `unknown`, so manual
marks have something to settle). Sends, resumes and cancels that a kill may land on are real
processes, so the kills are real; the commands no kill lands on run in-process.

The seed is fixed (NOTIFIER_STATEFUL_SEED overrides it) and printed; the 25 examples run as
5 parts of 5, part k from seed SEED + k, so that pytest-xdist's workers run them side by side
(about two minutes on two cores in all). Every step is logged, and each failed check carries
the log, because a replay of a failing example may not fail again: kills land where the clock
says.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from notifier.cli import cli
from notifier.domain import clock
from notifier.sandbox.server import Faults, Sandbox
from notifier.store import Store

from ..conftest import Workspace
from ..support.waits import PAST_EVERY_WINDOW

REAL_SHIFT = clock._SHIFT  # restored after each example's teardown
SEED = int(os.environ.get("NOTIFIER_STATEFUL_SEED", "20261201"))
# 25 examples in all, split so that xdist's workers share them: one 25-example test was the
# last to finish a parallel run by minutes. Same number of examples, each part its own seed.
PARTS, EXAMPLES_PER_PART = 5, 5
# NOTIFIER_STATEFUL_VERBOSE=1 (with pytest -s) prints every example's steps, passing or not.
VERBOSE = bool(os.environ.get("NOTIFIER_STATEFUL_VERBOSE"))
BATCH_SIZE = 12
CHANNELS = ("idem", "plain", "blind")
FINISHED = ("completed", "cancelled")
STATE_COUNTS = ("sent", "unknown", "pending", "failed", "in_flight")
# Generous: a step never comes near it unless something hangs, which is itself a failure.
PROCESS_TIMEOUT_S = 90.0
RETRY = "[retry]\nmax_attempts = 4\nbackoff_base = 0.02\nbackoff_max = 0.1\n"


@dataclass(frozen=True)
class KillAt:
    """When to SIGKILL a worker: once the sandboxes have seen `after` more POSTs (`on =
    "request"`) or commits (`on = "commit"`) than when it started (0: do not wait), then
    `then_s` seconds later. Counting lands the kill mid-send far more often than a bare delay
    would (starting Python takes longer than sending twelve notifications), and counting
    commits lands it in the worst window: delivered, the receipt not yet written."""

    after: int
    on: str
    then_s: float


KILLS = st.one_of(
    st.builds(KillAt, st.just(0), st.just("request"), st.floats(0.0, 0.8)),
    st.builds(
        KillAt, st.integers(1, 14), st.sampled_from(["request", "commit"]), st.floats(0, 0.02)
    ),
)


def _faults(seed: int, *, idempotent: bool) -> Faults:
    # At most one fault per POST; together they leave most requests answered normally. The
    # Retry-After of 0.2 s goes on the wire as `1` (delay-seconds round up), which the test
    # switch (fast_waits) makes a wait of a quarter second again.
    return Faults(
        seed=seed,
        throttle_rate=0.06,
        retry_after=0.2,
        fail_rate=0.06,
        error_rate=0.06,
        drop_rate=0.1,
        idempotent=idempotent,
    )


def _config(idem: Sandbox, plain: Sandbox) -> str:
    def channel(name: str, sandbox: Sandbox, *, idempotent: bool, queryable: bool) -> str:
        lines = [
            f"[channels.{name}]",
            'type = "webhook"',
            f'url = "{sandbox.notifications_url}"',
            f"idempotent = {'true' if idempotent else 'false'}",
            "timeout = 3",
        ]
        if not queryable:
            # Its unknown items are marked by hand, and a not-sent mark waits out the
            # receiver's window: 1 s after the request left, so that most marks made
            # mid-example are taken (the teardown moves the clock past the rest).
            lines[-1] = "timeout = 1"
            lines.append("query_delay = 0")
        if queryable:
            lines.append(f'status_url = "{sandbox.url}/notifications/{{key}}"')
        return "\n".join(lines) + "\n"

    return (
        channel("idem", idem, idempotent=True, queryable=True)
        + channel("plain", plain, idempotent=False, queryable=True)
        + channel("blind", plain, idempotent=False, queryable=False)
        + RETRY
    )


def _batch_rows() -> list[list[str]]:
    rows = [["id", "to", "subject", "body", "channel"]]
    for i in range(1, BATCH_SIZE + 1):
        channel = CHANNELS[(i - 1) % len(CHANNELS)]
        rows.append([f"u{i}", f"user{i}@example.com", f"Hello {i}", f"Body {i}", channel])
    return rows


class NotifierMachine(RuleBasedStateMachine):
    """One workspace, one batch, two faulty sandboxes per example."""

    example_seed = SEED  # the seed this machine's examples came from (a part's: SEED + part)

    def __init__(self, base: Path) -> None:
        super().__init__()
        self.ws = Workspace(base)
        self.idem: Sandbox | None = None
        self.plain: Sandbox | None = None
        self.log: list[str] = []
        self.report: dict[str, Any] | None = None  # the last `status --json`, once a run exists
        self.ok = True  # False from the start of a step until its checks passed
        self.manual_sent: set[str] = set()  # keys an operator marked sent
        self.send_args: tuple[str, ...] = ("send", "batch.csv")

    # ------------------------------------------------------------------ helpers

    def fail(self, what: str) -> str:
        return f"{what}\nsteps so far (seed {self.example_seed}):\n  " + "\n  ".join(self.log)

    def step(self, line: str) -> None:
        self.ok = False
        self.log.append(line)

    def sandboxes(self) -> tuple[Sandbox, Sandbox]:
        assert self.idem is not None and self.plain is not None
        return self.idem, self.plain

    def sandbox_for(self, channel: str) -> Sandbox:
        idem, plain = self.sandboxes()
        return idem if channel == "idem" else plain

    def requests(self, on: str = "request") -> int:
        """POSTs (or, with on="commit", commits) so far at both sandboxes."""
        total = "requests" if on == "request" else "commits"
        return sum(s.stats()["totals"][total] for s in self.sandboxes())

    def wait_for(self, proc: subprocess.Popen[str], when: KillAt) -> None:
        """Until the moment `when` names (or `proc` ended)."""
        seen = self.requests(when.on)
        limit = time.monotonic() + PROCESS_TIMEOUT_S
        while (
            proc.poll() is None
            and self.requests(when.on) - seen < when.after
            and time.monotonic() < limit
        ):
            time.sleep(0.001)
        time.sleep(when.then_s)

    def invoke(self, *args: str) -> Result:
        """The CLI in-process (quick) for commands that need no real process."""
        return CliRunner().invoke(
            cli,
            ["--db", str(self.ws.db), "--config", str(self.ws.path / "notifier.toml"), *args],
            catch_exceptions=False,
        )

    def run_cli(self, *args: str) -> tuple[int, str]:
        """A command that is never killed, in-process, from the workspace (the batch's path
        is relative to it): its exit status and output."""
        with contextlib.chdir(self.ws.path):
            result = self.invoke(*args)
        return result.exit_code, result.output

    def finish(self, proc: subprocess.Popen[str]) -> tuple[int, str]:
        out, err = proc.communicate(timeout=PROCESS_TIMEOUT_S)
        return proc.returncode, out + err

    def kill_at(self, proc: subprocess.Popen[str], when: KillAt) -> tuple[int, str]:
        """SIGKILL `proc` at the drawn moment (unless it finished first); its output and exit
        status. Then let the sandboxes finish whatever the dead client left in their hands."""
        self.wait_for(proc, when)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        code, output = self.finish(proc)
        # A killed client's last requests may still be in the sandboxes' hands (a body read,
        # the commit not yet made): the checks see the sandboxes once they have handled them.
        for sandbox in self.sandboxes():
            sandbox.quiesce()
        return code, output

    def where(self) -> str:
        return f"run {self.report['state']}" if self.report else "no run yet"

    def run_exists(self) -> bool:
        return self.report is not None

    def finished(self) -> bool:
        return self.report is not None and self.report["state"] in FINISHED

    def active(self) -> bool:
        return self.report is not None and self.report["state"] not in FINISHED

    def unknown_items(self) -> list[dict[str, Any]]:
        if self.report is None:
            return []
        return [i for i in self.report["items"] if i["state"] == "unknown"]

    def deliveries_by_key(self) -> dict[str, list[dict[str, Any]]]:
        """Every commit at either sandbox, by idempotency key."""
        found: dict[str, list[dict[str, Any]]] = {}
        for sandbox in self.sandboxes():
            for delivery in sandbox.deliveries():
                found.setdefault(str(delivery["idempotency_key"]), []).append(delivery)
        return found

    def expect(self, code: int, allowed: set[int], output: str, what: str) -> None:
        assert code in allowed, self.fail(
            f"{what} exited {code}, expected one of {sorted(allowed)}:\n{output}"
        )

    def honest_mark(self, item: dict[str, Any], otherwise: str) -> tuple[str, str]:
        """What an honest operator marks an unknown item after reading the sandbox's
        `/deliveries`: sent only if the sandbox holds the key, otherwise `otherwise`."""
        key = item["idempotency_key"]
        held = [
            d for d in self.sandbox_for(item["channel"]).deliveries() if d["idempotency_key"] == key
        ]
        if held:
            return "sent", f"sandbox /deliveries holds {key} as {held[0]['id']}"
        return otherwise, f"sandbox /deliveries holds nothing under {key}"

    def mark(self, item: dict[str, Any], mark: str, evidence: str) -> None:
        result = self.invoke(
            "reconcile", "--manual", "--item", item["id"], "--mark", mark, "--evidence", evidence
        )
        self.log.append(f"    mark {item['id']} {mark} ({evidence}) → exit {result.exit_code}")
        if mark == "not-sent" and result.exit_code == 4 and "may still commit" in result.output:
            # Inside the receiver's window nothing shows that it was not sent: refused, the
            # item left as it was. The operator looks again later.
            return
        self.expect(result.exit_code, {0, 3}, result.output, f"reconcile --manual {item['id']}")
        if mark == "sent":
            self.manual_sent.add(item["idempotency_key"])

    # ------------------------------------------------------------------ setup

    @initialize(
        idem_seed=st.integers(0, 2**16),
        plain_seed=st.integers(0, 2**16),
        concurrency=st.sampled_from([1, 3]),
        kill=st.none() | KILLS,
    )
    def setup(self, idem_seed: int, plain_seed: int, concurrency: int, kill: KillAt | None) -> None:
        """Start the sandboxes, write the config and the batch, and send it once (a kill may
        land before the run is stored: then a later `send` plans it). With a window of 3, a
        kill leaves several requests in flight at once."""
        self.log.append(
            f"setup: sandbox seeds idem={idem_seed} plain={plain_seed}, concurrency {concurrency}"
        )
        self.send_args = ("send", "batch.csv", "--concurrency", str(concurrency))
        self.idem = Sandbox(faults=_faults(idem_seed, idempotent=True)).start()
        self.plain = Sandbox(faults=_faults(plain_seed, idempotent=False)).start()
        (self.ws.path / "notifier.toml").write_text(_config(self.idem, self.plain))
        self.ws.write_csv("batch.csv", _batch_rows())
        self.send(kill)

    # Every rule is always enabled and adapts to where the run stands: whether a run exists
    # after a kill depends on the clock, and a precondition reading it would make hypothesis
    # see the same choices enable different rules (FlakyStrategyDefinition).

    @rule(kill=st.none() | KILLS)
    def send(self, kill: KillAt | None) -> None:
        """Plan and send the batch; while its run is unfinished, the same batch is refused
        (exit 2: its rows are open there) or has nothing left to send, and nothing new is
        planned or sent. Once the run is finished, a send would plan a new run of what it
        did not deliver (tests/engine/test_cross_run.py), outside this model of one run."""
        if self.finished():
            return
        if self.run_exists():
            self.step("send the same batch again")
            before = self.requests()
            code, output = self.run_cli(*self.send_args)
            self.log.append(f"    → exit {code}")
            self.expect(code, {0, 2}, output, "a second send of the same batch")
            assert "still open" in output or "nothing to send" in output, self.fail(output)
            assert self.requests() == before, self.fail("a refused send made requests")
            return
        self.step(f"send kill={kill}")
        proc = self.ws.popen(*self.send_args)
        code, output = self.finish(proc) if kill is None else self.kill_at(proc, kill)
        self.log.append(f"    → exit {code}")
        self.expect(code, {0, 3} if kill is None else {0, 3, -signal.SIGKILL}, output, "send")

    @rule(kill=st.none() | KILLS)
    def resume(self, kill: KillAt | None) -> None:
        """Resume the run; with no unfinished run there is nothing to resume (exit 2)."""
        self.step(f"resume kill={kill} ({self.where()})")
        allowed = {0, 3} if self.active() else {2}
        proc = self.ws.popen("resume")
        code, output = self.finish(proc) if kill is None else self.kill_at(proc, kill)
        self.log.append(f"    → exit {code}")
        if kill is not None:
            allowed.add(-signal.SIGKILL)
        self.expect(code, allowed, output, "resume")

    @rule(during=st.none() | KILLS)
    def cancel(self, during: KillAt | None) -> None:
        """Cancel with no worker alive (it settles what was left in flight), or at a drawn
        moment while a worker (`send` before a run is stored, else `resume`) is sending; once
        both returned the run is closed, whoever got there first."""
        if during is None:
            self.step(f"cancel ({self.where()})")
            code, output = self.run_cli("cancel", "--wait", "20")
            self.log.append(f"    → exit {code}")
            self.expect(code, {0, 3} if self.active() else {2}, output, "cancel")
            return
        command = "resume" if self.run_exists() else "send"
        self.step(f"cancel while a {command} works, at {during} ({self.where()})")
        worker = self.ws.popen(*(self.send_args if command == "send" else ["resume"]))
        self.wait_for(worker, during)
        code, output = self.run_cli("cancel", "--wait", "30")
        worker_code, worker_output = self.finish(worker)
        self.log.append(f"    → cancel exit {code}, worker exit {worker_code}")
        # Exit 2: cancel found no unfinished run (not planned yet, or already finished), or
        # the worker found the run already closed. Exit 3: the worker was cancelled.
        self.expect(code, {0, 2, 3}, output, f"cancel during a {command}")
        self.expect(worker_code, {0, 2, 3}, worker_output, f"the {command} a cancel stopped")
        if code != 2:
            final = json.loads(self.invoke("status", "--json").stdout)
            assert final["state"] in FINISHED, self.fail(
                f"after cancel returned, the run is {final['state']}:\n{output}\n{worker_output}"
            )

    @rule(after_s=st.floats(0.2, 0.9))
    def cancel_killed(self, after_s: float) -> None:
        """A `cancel` with no worker alive, SIGKILLed while it settles and closes the run
        (starting Python takes most of the first 0.4 s): nothing it half did may show."""
        self.step(f"cancel killed after {after_s:.3f}s ({self.where()})")
        code, output = self.kill_at(
            self.ws.popen("cancel", "--wait", "20"), KillAt(0, "request", after_s)
        )
        self.log.append(f"    → exit {code}")
        allowed = {0, 3} if self.active() else {2}
        self.expect(code, {*allowed, -signal.SIGKILL}, output, "cancel")

    @rule()
    def reconcile(self) -> None:
        """Settle in-flight and unknown items by query (exit 2 while no run is stored)."""
        self.step(f"reconcile by query ({self.where()})")
        result = self.invoke("reconcile")
        self.log.append(f"    → exit {result.exit_code}")
        allowed = {0, 3} if self.run_exists() else {2}
        self.expect(result.exit_code, allowed, result.output, "reconcile")

    @rule(pick=st.integers(0, BATCH_SIZE), otherwise=st.sampled_from(["not-sent", "abandon"]))
    def mark_by_hand(self, pick: int, otherwise: str) -> None:
        """An honest operator settles one unknown item from what the sandbox holds; with no
        unknown item, a mark on another item is refused (exit 2) and changes nothing."""
        if self.report is None:
            self.step("manual mark: no run yet, nothing to mark")
            return
        unknown = self.unknown_items()
        if unknown:
            item = unknown[pick % len(unknown)]
            self.step(f"manual mark of {item['id']} (otherwise {otherwise})")
            self.mark(item, *self.honest_mark(item, otherwise))
            return
        item = self.report["items"][pick % BATCH_SIZE]
        self.step(f"manual mark of {item['id']}, which is {item['state']}")
        before = self.report["counts"]
        result = self.invoke(
            "reconcile", "--manual", "--item", item["id"], "--mark", "sent", "--evidence", "x"
        )
        self.log.append(f"    → exit {result.exit_code}")
        self.expect(result.exit_code, {2}, result.output, "a mark on an item that is not unknown")
        after = json.loads(self.invoke("status", "--json").stdout)["counts"]
        assert after == before, self.fail(f"a refused mark changed the counts: {after}")

    # ------------------------------------------------------------------ checks

    @invariant()
    def everything_agrees(self) -> None:
        """After every step: the file passes its invariants, the report adds up, no key was
        committed twice, and every commit is accounted for in the database."""
        if self.idem is None:
            return
        commits = self.deliveries_by_key()
        runs = self.stored_runs()
        if not runs:
            assert not commits, self.fail(f"commits before any run was stored: {commits}")
            self.ok = True
            return
        assert len(runs) == 1, self.fail(f"one batch, several runs: {runs}")
        result = self.invoke("status", "--json")
        assert result.exit_code in (0, 3), self.fail(f"status --json: {result.output}")
        report: dict[str, Any] = json.loads(result.stdout)
        self.report = report
        self.log.append(
            f"    run {report['state']}: "
            + ", ".join(f"{s} {report['counts'][s]}" for s in STATE_COUNTS)
        )
        counts = report["counts"]
        assert counts["total"] == sum(counts[s] for s in STATE_COUNTS) == BATCH_SIZE, self.fail(
            f"counts do not add up: {counts}"
        )
        assert len(report["items"]) == BATCH_SIZE, self.fail("status --json lists every item")
        assert Counter(i["state"] for i in report["items"]) == Counter(
            {s: counts[s] for s in STATE_COUNTS if counts[s]}
        ), self.fail(f"the items disagree with the counts {counts}")
        assert sum(report["pending_detail"].values()) == counts["pending"], self.fail(
            f"pending_detail {report['pending_detail']} vs pending {counts['pending']}"
        )
        if report["state"] == "cancelled":
            # A cancel settles every retry that may have been delivered.
            assert report["pending_detail"]["maybe_delivered"] == 0, self.fail(
                f"a cancelled run still calls items maybe delivered: {report['pending_detail']}"
            )
        table = self.invoke("status")
        assert table.exit_code in (0, 3), self.fail(f"status: {table.output}")
        self.check_commits(report, commits, settled=False)
        self.ok = True

    def stored_runs(self) -> list[str]:
        if not self.ws.db_file.exists():
            return []
        # Opening runs check_invariants(); a refusal here fails the step.
        store = Store.open(self.ws.db, readonly=True)
        try:
            return [run.run_id for run in store.core.runs()]
        finally:
            store.close()

    def check_commits(
        self, report: dict[str, Any], commits: dict[str, list[dict[str, Any]]], *, settled: bool
    ) -> None:
        """No key committed twice; every commit is a `sent` item, or (unless `settled`) one
        whose outcome is still open; every `sent` item is committed once, with its digest."""
        items = {i["idempotency_key"]: i for i in report["items"]}
        twice = {k: [d["id"] for d in v] for k, v in commits.items() if len(v) > 1}
        assert not twice, self.fail(f"keys committed more than once: {twice}")
        for key, (delivery, *_) in commits.items():
            item = items.get(key)
            assert item is not None, self.fail(f"the sandbox holds a key of no item: {key}")
            where = self.sandbox_for(item["channel"])
            assert delivery in where.deliveries(), self.fail(f"{key} reached the wrong sandbox")
            assert delivery["intent_digest"] == item["intent_digest"], self.fail(
                f"{key} committed with another digest"
            )
            state, kind = item["state"], item["pending_kind"]
            open_outcome = state in ("unknown", "in_flight") or kind == "maybe_delivered"
            assert state == "sent" or (open_outcome and not settled), self.fail(
                f"item {item['id']} was committed at the sandbox ({delivery['id']}) but the "
                f"database says {state} ({kind}); last error: {item['last_error']}"
            )
        for item in report["items"]:
            if item["state"] != "sent":
                continue
            held = commits.get(item["idempotency_key"], [])
            assert len(held) == 1, self.fail(
                f"item {item['id']} is sent ({item['receipt_source']}) but the sandbox holds "
                f"{len(held)} deliveries under its key"
            )
            manual = item["idempotency_key"] in self.manual_sent
            assert manual == (item["receipt_source"] == "manual"), self.fail(
                f"item {item['id']}: receipt source {item['receipt_source']}, marked by hand: "
                f"{manual}"
            )
            if item["receipt_source"] in ("send", "query"):
                assert item["receipt_id"] == held[0]["id"], self.fail(
                    f"item {item['id']}: receipt {item['receipt_id']} is not the sandbox's "
                    f"delivery {held[0]['id']}"
                )

    # ------------------------------------------------------------------ the end

    def settle_everything(self) -> None:
        """Resume (or, on a cancelled run, settle by hand) until the run is finished and no
        item is left open; then every sent item is committed exactly once, and every commit
        is a sent item."""
        self.log.append("teardown: settle everything, once every receiver's window has passed")
        # Every command from here runs in this process. Before each round the operator waits
        # out every receiver's window, of the requests sent so far (the resume of a round
        # sends some): this process's clock moved on (tests/support/waits.py), so the
        # not-sent marks of the round are taken.
        self.everything_agrees()
        for _ in range(8):
            clock._SHIFT += PAST_EVERY_WINDOW
            if self.report is None:
                return  # never planned: the invariant already checked nothing was sent
            unknown = self.unknown_items()
            if unknown:
                otherwise = "abandon" if self.finished() else "not-sent"
                for item in unknown:
                    self.mark(item, *self.honest_mark(item, otherwise))
            elif self.active():
                code, output = self.run_cli("resume")
                self.log.append(f"    resume → exit {code}")
                self.expect(code, {0, 3}, output, "resume at the end")
            else:
                break
            self.everything_agrees()
        assert self.report is not None
        assert self.finished() and not self.unknown_items(), self.fail(
            f"the run did not finish: {self.report['state']} {self.report['counts']}"
        )
        assert self.report["counts"]["in_flight"] == 0, self.fail("in flight after the end")
        self.check_commits(self.report, self.deliveries_by_key(), settled=True)

    def teardown(self) -> None:
        try:
            if self.ok and self.idem is not None:
                self.settle_everything()
        finally:
            clock._SHIFT = REAL_SHIFT
            if VERBOSE:
                print("\n".join(["example:", *self.log]))
            self.ws.stop_children()  # any a step that failed midway left running
            for sandbox in (self.idem, self.plain):
                if sandbox is not None:
                    sandbox.stop()
            if self.ok:
                shutil.rmtree(self.ws.path, ignore_errors=True)


# 5 examples of up to 10 real processes each per part: 100 s for the 5 parts in a serial run
# on a loaded machine.
@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("part", range(PARTS))
def test_random_operations_keep_database_report_and_downstream_in_agreement(
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    fast_waits: float,
    part: int,
) -> None:
    """Random send / SIGKILL / resume / cancel / reconcile / manual-mark sequences against
    faulty sandboxes never commit a key twice, never leave a commit unaccounted for, and keep
    the file's invariants and the report's counts."""
    monkeypatch.delenv("NOTIFIER_CRASH_AT", raising=False)
    monkeypatch.delenv("NOTIFIER_DB", raising=False)
    part_seed = SEED + part
    print(f"stateful test seed: {part_seed} = {SEED} (NOTIFIER_STATEFUL_SEED overrides) + {part}")

    class Machine(NotifierMachine):
        example_seed = part_seed

        def __init__(self) -> None:
            super().__init__(tmp_path_factory.mktemp("stateful"))

    run_state_machine_as_test(
        seed(part_seed)(Machine),
        settings=settings(
            max_examples=EXAMPLES_PER_PART,
            stateful_step_count=10,
            deadline=None,
            database=None,
            # Kills land where the clock says, so a failing example may not fail again:
            # shrinking it would mostly chase timing. The step log in each failure is the
            # reproduction.
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
