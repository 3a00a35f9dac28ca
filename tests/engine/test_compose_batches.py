"""`send --compose --batch-api` drafts through the Message Batches API (the real
`anthropic` SDK against FakeBatches on 127.0.0.1), each chunk a durable intent: recorded
before `create`, its batch id after, its results stored by custom_id; a crash at each point
is resumed without a second batch for a chunk (unless `--recreate`), every row drafted once.
A create whose answer was lost is settled by asking, never retried blindly; `cancel` asks
before ending a chunk whose batch may exist; chunk writes are fenced by the drafter's lease,
and a create needs it surely held."""

from __future__ import annotations

import re
from collections import Counter, deque
from collections.abc import Iterator
from typing import Any

import pytest

from notifier.domain.intent import intent_digest

from ..conftest import DB_ERRORS, Workspace
from ..fake_messages import KEY, Canned, FakeBatches, error, serving, text_only_answer
from ..support.crashed import crash_invoke
from .test_compose import batch, brief

pytestmark = pytest.mark.both_stores
ROWS = [f"u{i}" for i in range(1, 6)]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeBatches]:
    """The fake API with batch endpoints; chunks of 2 rows, polls 10 ms apart."""
    server = FakeBatches()
    with serving(monkeypatch, server):
        yield server


def send(ws: Workspace, n: int = 5, *extra: str) -> list[str]:
    return ["send", str(batch(ws, n)), "--compose", str(brief(ws)), "--batch-api", *extra]


def chunk_states(ws: Workspace) -> list[tuple[int, str, int]]:
    try:
        return [(c["chunk"], c["state"], c["created"]) for c in ws.ledger.draft_chunks()]
    except DB_ERRORS:
        return []


def assert_drafted_once_and_digests_hold(ws: Workspace) -> None:
    """Every row drafted exactly once (one draft event per row) and every stored digest is
    the digest of its stored intent."""
    drafted = Counter(e.item_seq for e in ws.ledger.events("drafted"))
    assert sorted(drafted.items()) == [(i, 1) for i in range(1, 6)]
    for item in ws.ledger.items():
        payload = ws.ledger.payload(item.seq)
        assert intent_digest(item.channel, item.target, payload) == item.intent_digest


def test_batch_api_drafts_every_row_in_chunks_one_batch_each(
    ws: Workspace, fake: FakeBatches
) -> None:
    """Five rows in chunks of two: three batches created, custom_ids within the API's rules
    carrying nonce, chunk and row, no per-row Messages request, every row drafted once and
    sent; status shows chunks, rows drafted and tokens."""
    result = ws.invoke(*send(ws))
    assert result.exit_code == 0, result.output
    assert len(fake.created()) == 3 and fake.requests == []
    ids = [r["custom_id"] for b in fake.created() for r in fake.batches[b]["requests"]]
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{1,64}", c) for c in ids)
    assert [c.split("_")[1:] for c in ids] == [
        ["1", "1"],
        ["1", "2"],
        ["2", "3"],
        ["2", "4"],
        ["3", "5"],
    ]
    assert sorted(fake.succeeded) == ROWS
    assert_drafted_once_and_digests_hold(ws)
    assert sorted(d["item_id"] for d in ws.outbox_documents()) == ROWS
    drafts = ws.status()["drafts"]
    assert drafts["chunks"]["done"] == 3 and drafts["drafted"] == 5
    assert drafts["input_tokens"] == 55 and drafts["output_tokens"] == 35
    table = ws.invoke("status").output
    assert "chunks: 3 (3 done" in table, table


@pytest.mark.parametrize(
    ("point", "created"),
    [("after-chunk-intent:2", 3), ("after-batch-create:2", 3), ("mid-stream:3", 3)],
)
def test_a_crash_at_each_point_resumes_without_a_second_batch(
    ws: Workspace, fake: FakeBatches, point: str, created: int
) -> None:
    """Killed after chunk 2's intent, after its create (batch unrecorded), or mid-stream:
    resume settles by asking (adopting the batch that carries chunk 2's custom_ids, never
    chunk 1's of the same size), so the fake saw one batch per chunk and each row was
    drafted once."""
    crash_invoke(ws, point, *send(ws))
    resumed = ws.invoke("resume")
    assert resumed.exit_code == 0, resumed.output
    assert len(fake.created()) == created
    assert sorted(fake.succeeded) == ROWS  # no row was paid for twice
    assert [state for _, state, _ in chunk_states(ws)] == ["done", "done", "done"]
    assert_drafted_once_and_digests_hold(ws)
    assert sorted(d["item_id"] for d in ws.outbox_documents()) == ROWS
    if point.startswith("after-batch-create"):
        assert "adopted" in resumed.output


def test_recreate_is_the_operators_choice_to_pay_twice(ws: Workspace, fake: FakeBatches) -> None:
    """After a crash right after create, `resume --recreate` creates chunk 2 again without
    asking (four batches), says so, and still stores one draft per row."""
    crash_invoke(ws, "after-batch-create:2", *send(ws))
    resumed = ws.invoke("resume", "--recreate")
    assert resumed.exit_code == 0, resumed.output
    assert "--recreate: 1 batch chunk(s)" in resumed.output
    assert len(fake.created()) == 4
    orphan = fake.created()[1]  # created by the crashed send, never recorded
    recorded = [c["batch_id"] for c in ws.ledger.draft_chunks()]
    assert orphan not in recorded and len(set(recorded)) == 3
    assert chunk_states(ws)[1] == (2, "done", 1)
    assert_drafted_once_and_digests_hold(ws)


def test_recreate_consent_is_spent_by_the_create_even_if_it_crashes(
    ws: Workspace, fake: FakeBatches
) -> None:
    """A crash right after a --recreate create: the next plain resume asks and adopts."""
    crash_invoke(ws, "after-batch-create:1", *send(ws))
    crash_invoke(ws, "after-batch-create:1", "resume", "--recreate")
    assert len(fake.created()) == 2
    resumed = ws.invoke("resume")
    assert resumed.exit_code == 0, resumed.output
    assert "adopted" in resumed.output and len(fake.created()) == 4  # chunks 2 and 3
    assert_drafted_once_and_digests_hold(ws)


def test_expired_and_transient_rows_go_into_a_later_chunk_invalid_ones_fail(
    ws: Workspace, fake: FakeBatches
) -> None:
    """An expired row and an overloaded row are asked again in a later chunk; a row the API
    calls an invalid request fails with the API's message; an unusable answer fails with its
    tokens counted."""
    fake.expire_once.add("u1")
    fake.error_once["u2"] = ("overloaded_error", "Overloaded")
    fake.error_once["u3"] = ("invalid_request_error", "prompt is too long")
    fake.per_row["u4"] = deque([text_only_answer()])
    result = ws.invoke(*send(ws))
    assert result.exit_code == 3, result.output
    assert len(fake.created()) == 4  # three chunks, then one for u1 and u2
    assert fake.batches[fake.created()[3]]["requests"][0]["custom_id"].endswith("_4_1")
    assert sorted(fake.succeeded) == ["u1", "u2", "u4", "u5"]
    status = ws.status()
    assert status["counts"]["sent"] == 3 and status["counts"]["failed"] == 2
    errors = {i["id"]: i["last_error"] for i in status["items"] if i["state"] == "failed"}
    assert "invalid_request_error: prompt is too long" in errors["u3"]
    assert "no notification_draft tool call" in errors["u4"]
    assert status["drafts"]["output_tokens"] == 3 * 7 + 9


def test_polling_honours_retry_after(ws: Workspace, fake: FakeBatches) -> None:
    """A 429 with retry-after: 1 on a poll: the next poll comes no sooner than a second."""
    fake.retrieve_script.append(error(429, "rate_limit_error", "slow", {"retry-after": "1"}))
    result = ws.invoke(*send(ws, 2))
    assert result.exit_code == 0, result.output
    assert fake.retrieved_at[1] - fake.retrieved_at[0] >= 0.9


def test_dry_run_with_batch_api_keeps_the_synchronous_three_drafts(
    ws: Workspace, fake: FakeBatches
) -> None:
    """--dry-run --compose --batch-api: three synchronous drafts, no batch, nothing stored."""
    result = ws.invoke(*send(ws, 5, "--dry-run"))
    assert result.exit_code == 0, result.output
    assert sorted(fake.rows_requested()) == ["u1", "u2", "u3"] and fake.created() == []
    assert not ws.has_database()


def test_above_the_documented_row_count_drafting_uses_batches_by_default(
    ws: Workspace, fake: FakeBatches, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1001 rows without --batch-api (threshold 1000) draft through one batch, not 1001
    Messages requests."""
    monkeypatch.setenv("NOTIFIER_BATCH_CHUNK_ROWS", "2000")
    result = ws.invoke(
        "send", str(batch(ws, 1001)), "--compose", str(brief(ws)), "--require-approval"
    )
    assert result.exit_code == 0, result.output
    assert len(fake.created()) == 1 and fake.requests == []
    assert ws.status()["drafts"]["drafted"] == 1001


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
    with serving(monkeypatch, server):
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
        assert [(c["chunk"], c["state"]) for c in ws.ledger.draft_chunks()] == [(1, "creating")]
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
        crash_invoke(ws, "after-batch-create:1", *send(ws))
        cancelled = ws.invoke("cancel")
        assert sorted(fake.cancelled) == sorted(fake.created()) != [], cancelled.output
        assert "(not created)" not in cancelled.output
        assert [s for _, s, _ in chunk_states(ws)] == ["canceled"]


def test_cancel_without_the_key_leaves_a_creating_chunk_open_and_says_why(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the key, `cancel` leaves a `creating` chunk open (exit 3); with it, cancels."""
    server = FakeBatches()
    server.polls_in_progress = 10**6
    for fake in serve(monkeypatch, server):
        crash_invoke(ws, "after-batch-create:1", *send(ws))
        monkeypatch.delenv("ANTHROPIC_API_KEY")
        refused = ws.invoke("cancel")
        assert refused.exit_code == 3, refused.output
        assert "ANTHROPIC_API_KEY is not set" in refused.output
        assert "(not created)" not in refused.output and fake.cancelled == []
        assert [s for _, s, _ in chunk_states(ws)] == ["creating"]
        monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
        run_id = ws.ledger.run().run_id
        again = ws.invoke("cancel", run_id)
        assert fake.cancelled == fake.created() != [], again.output
        assert [s for _, s, _ in chunk_states(ws)] == ["canceled"]


def test_cancel_out_of_reach_leaves_every_open_chunk_open(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the API out of reach, each open chunk is tried, none is claimed cancelled."""
    server = FakeBatches()
    server.polls_in_progress = 10**6
    for _ in serve(monkeypatch, server):
        crash_invoke(ws, "after-batch-create:2", *send(ws))
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9")  # nothing listens
    result = ws.invoke("cancel")
    assert result.exit_code == 3, result.output
    assert result.output.count("could not be asked") == 2, result.output
    assert [s for _, s, _ in chunk_states(ws)] == ["submitted", "creating"]


def test_a_drafter_not_surely_holding_its_lease_creates_nothing(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No `create` unless the lease is surely held right before it; resume creates then."""
    for fake in serve(monkeypatch, FakeBatches()):
        with monkeypatch.context() as patched:
            patched.setattr(
                "notifier.engine.membership._HeldLease.surely_valid", lambda self: False
            )
            stopped = ws.invoke(*send(ws))
        assert stopped.exit_code == 3, stopped.output
        assert "lease" in stopped.output and fake.created() == []
        assert [s for _, s, _ in chunk_states(ws)] == ["creating"]
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
            self.ws.forge.run_lease_taken_over()
        return super().on_post(path, payload)


def test_chunk_writes_are_fenced_by_the_drafters_lease(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A drafter whose lease was taken over during create records nothing more."""
    for fake in serve(monkeypatch, TakenOverOnCreate(ws)):
        result = ws.invoke(*send(ws))
        assert result.exit_code != 0 and "took over" in result.output, result.output
        assert len(fake.created()) == 1
        chunks = ws.ledger.draft_chunks()
        assert [(c["state"], c["batch_id"]) for c in chunks] == [("creating", None)]


def test_the_api_key_quoted_in_a_batch_result_is_masked(ws: Workspace, fake: FakeBatches) -> None:
    """A row's result quoting ANTHROPIC_API_KEY is stored and shown masked, as the Messages
    API's refusals are (tests/engine/test_a_secret_a_downstream_echoes_is_never_kept_or_shown.py);
    the database bytes are read on SQLite."""
    fake.error_once["u1"] = ("invalid_request_error", f"request made with key {KEY} is invalid")
    sent = ws.invoke("send", str(batch(ws, 2)), "--compose", str(brief(ws)), "--batch-api")
    assert sent.exit_code == 3, sent.output
    outputs = [sent.output, ws.invoke("status", "--json").output,
               ws.invoke("report", "--format", "csv").output]  # fmt: skip
    assert "invalid_request_error" in outputs[1]  # the row failed with the API's message
    assert [text for text in outputs if KEY in text] == []
    assert KEY.encode() not in ws.stored_bytes()
