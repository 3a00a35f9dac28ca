"""Review of `--batch-api`: a create whose answer was lost is settled by asking, never
retried blindly; `cancel` asks before ending a chunk whose batch may exist; chunk writes
are fenced by the drafter's lease, and create needs it surely held."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from .conftest import Workspace
from .fake_messages import Canned, FakeBatches, error
from .test_compose import KEY
from .test_compose_batches import ROWS, send

pytestmark = pytest.mark.both_stores


class LosesCreateAnswers(FakeBatches):
    """FakeBatches whose first `lose` creates make the batch, then answer `status`."""

    def __init__(self, lose: int = 1, status: int = 500, made: bool = True) -> None:
        super().__init__()
        self.lose, self.status, self.made = lose, status, made

    def on_post(self, path: str, payload: dict[str, Any]) -> Canned:
        if path == "/v1/messages/batches" and self.lose > 0:
            self.lose -= 1
            if self.made:
                super().on_post(path, payload)
            return error(self.status, "api_error", "an error answered to a create")
        return super().on_post(path, payload)


def serve(monkeypatch: pytest.MonkeyPatch, server: FakeBatches) -> Iterator[FakeBatches]:
    with server.running():
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
        monkeypatch.setenv("NOTIFIER_BATCH_CHUNK_ROWS", "2")
        monkeypatch.setenv("NOTIFIER_BATCH_POLL_S", "0.01")
        yield server


def test_a_lost_create_answer_is_settled_by_asking_not_retried(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 500 to a create that made its batch: that batch is adopted, no second one made."""
    for fake in serve(monkeypatch, LosesCreateAnswers()):
        result = ws.invoke(*send(ws))
        assert result.exit_code == 0, result.output
        assert len(fake.created()) == 3, result.output
        assert "carries its custom_ids: adopted" in result.output
        assert sorted(fake.succeeded) == ROWS


def test_a_create_refused_with_429_is_retried_once_made(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 429 to a create proves nothing was made: it is retried, one batch per chunk."""
    server = LosesCreateAnswers(status=429, made=False)
    for fake in serve(monkeypatch, server):
        result = ws.invoke(*send(ws))
        assert result.exit_code == 0, result.output
        assert len(fake.created()) == 3 and "asking" not in result.output


def test_creates_unanswered_every_time_stop_with_the_chunk_creating(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Creates that never answer (none made) stop drafting, chunk `creating`; resume creates."""
    for fake in serve(monkeypatch, LosesCreateAnswers(lose=3, status=529, made=False)):
        result = ws.invoke(*send(ws))
        assert result.exit_code == 3, result.output
        assert fake.created() == []
        assert ws.query("SELECT chunk, state FROM draft_chunks") == [(1, "creating")]
        resumed = ws.invoke("resume")
        assert resumed.exit_code == 0, resumed.output
        assert len(fake.created()) == 3 and sorted(fake.succeeded) == ROWS


def test_cancel_after_a_crash_after_create_cancels_the_unrecorded_batch(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`cancel` of a chunk left `creating` finds and cancels the batch that may be its own."""
    server = FakeBatches()
    server.polls_in_progress = 10**6
    for fake in serve(monkeypatch, server):
        crashed = ws.run(*send(ws), env={"NOTIFIER_CRASH_AT": "after-batch-create:1"})
        assert crashed.returncode == 137, crashed.stderr
        cancelled = ws.invoke("cancel")
        assert sorted(fake.cancelled) == sorted(fake.created()) != [], cancelled.output
        assert "(not created)" not in cancelled.output
        assert ws.query("SELECT state FROM draft_chunks") == [("canceled",)]


def test_cancel_without_the_key_leaves_a_creating_chunk_open_and_says_why(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the key, `cancel` leaves a `creating` chunk open (exit 3); with it, cancels."""
    server = FakeBatches()
    server.polls_in_progress = 10**6
    for fake in serve(monkeypatch, server):
        crashed = ws.run(*send(ws), env={"NOTIFIER_CRASH_AT": "after-batch-create:1"})
        assert crashed.returncode == 137, crashed.stderr
        monkeypatch.delenv("ANTHROPIC_API_KEY")
        refused = ws.invoke("cancel")
        assert refused.exit_code == 3, refused.output
        assert "ANTHROPIC_API_KEY is not set" in refused.output
        assert "(not created)" not in refused.output and fake.cancelled == []
        assert ws.query("SELECT state FROM draft_chunks") == [("creating",)]
        monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
        run_id = ws.query("SELECT run_id FROM runs")[0][0]
        again = ws.invoke("cancel", run_id)
        assert fake.cancelled == fake.created() != [], again.output
        assert ws.query("SELECT state FROM draft_chunks") == [("canceled",)]


def test_cancel_out_of_reach_leaves_every_open_chunk_open(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the API out of reach, each open chunk is tried, none is claimed cancelled."""
    server = FakeBatches()
    server.polls_in_progress = 10**6
    for _ in serve(monkeypatch, server):
        crashed = ws.run(*send(ws), env={"NOTIFIER_CRASH_AT": "after-batch-create:2"})
        assert crashed.returncode == 137, crashed.stderr
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9")  # nothing listens
    result = ws.invoke("cancel")
    assert result.exit_code == 3, result.output
    assert result.output.count("could not be asked") == 2, result.output
    assert ws.query("SELECT state FROM draft_chunks ORDER BY chunk") == [
        ("submitted",),
        ("creating",),
    ]


def test_a_drafter_not_surely_holding_its_lease_creates_nothing(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No `create` unless the lease is surely held right before it; resume creates then."""
    for fake in serve(monkeypatch, FakeBatches()):
        with monkeypatch.context() as patched:
            patched.setattr("notifier.lease._HeldLease.surely_valid", lambda self: False)
            stopped = ws.invoke(*send(ws))
        assert stopped.exit_code == 3, stopped.output
        assert "lease" in stopped.output and fake.created() == []
        assert ws.query("SELECT state FROM draft_chunks") == [("creating",)]
        resumed = ws.invoke("resume")
        assert resumed.exit_code == 0, resumed.output
        assert len(fake.created()) == 3 and sorted(fake.succeeded) == ROWS


class TakenOverOnCreate(FakeBatches):
    """FakeBatches that, making the first batch, moves the run's lease on (a takeover)."""

    def __init__(self, ws: Workspace) -> None:
        super().__init__()
        self.ws = ws

    def on_post(self, path: str, payload: dict[str, Any]) -> Canned:
        if path == "/v1/messages/batches" and not self.order:
            self.ws.write("UPDATE runs SET lease_version = lease_version + 1")
        return super().on_post(path, payload)


def test_chunk_writes_are_fenced_by_the_drafters_lease(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A drafter whose lease was taken over during create records nothing more."""
    for fake in serve(monkeypatch, TakenOverOnCreate(ws)):
        result = ws.invoke(*send(ws))
        assert result.exit_code != 0 and "took over" in result.output, result.output
        assert len(fake.created()) == 1
        assert ws.query("SELECT state, batch_id FROM draft_chunks") == [("creating", None)]
