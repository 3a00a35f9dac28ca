"""Real downstream: the CLI sending through the webhook channel to the sandbox provider on
127.0.0.1, with its faults switched on (docs/design.md sections 6, 7 and 11)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
import standardwebhooks

from notifier.domain import waits
from notifier.sandbox.server import Faults, Sandbox

from ..conftest import Workspace, make_rows
from ..support.crashed import crash_invoke

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
FAST_RETRY = "[retry]\nmax_attempts = 12\nbackoff_base = 0.02\nbackoff_max = 0.2\n"


@pytest.fixture
def sandbox(request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    faults = getattr(request, "param", Faults())
    with Sandbox(faults=faults) as running:
        yield running


def configure(
    ws: Workspace, sandbox: Sandbox, *, idempotent: bool, status: bool, extra: str = ""
) -> None:
    lines = [
        "[channels.hooks]",
        'type = "webhook"',
        f'url = "{sandbox.notifications_url}"',
        f"idempotent = {'true' if idempotent else 'false'}",
        "timeout = 5",
    ]
    if status:
        lines.append(f'status_url = "{sandbox.url}/notifications/{{key}}"')
    (ws.path / "notifier.toml").write_text("\n".join(lines) + "\n" + extra + FAST_RETRY)


def webhook_config(ws: Workspace, sandbox: Sandbox, *, status: bool, max_attempts: int) -> None:
    """A `hooks` channel to the sandbox that dedupes by key, asked by key only with `status`."""
    lines = [
        "[channels.hooks]",
        'type = "webhook"',
        f'url = "{sandbox.notifications_url}"',
        "idempotent = true",
        "timeout = 5",
    ]
    if status:
        lines.append(f'status_url = "{sandbox.url}/notifications/{{key}}"')
    lines += ["[retry]", f"max_attempts = {max_attempts}", "backoff_base = 0.01",
              "backoff_max = 0.05"]  # fmt: skip
    (ws.path / "notifier.toml").write_text("\n".join(lines) + "\n")


def send(ws: Workspace, n: int, *args: str) -> Any:
    ws.write_csv("batch.csv", make_rows(n))
    return ws.invoke("send", "batch.csv", "--channel", "hooks", *args)


def keys(ws: Workspace) -> dict[int, str]:
    return {item.seq: item.idempotency_key for item in ws.ledger.items()}


def commits(sandbox: Sandbox) -> dict[str, int]:
    return {k: v["commits"] for k, v in sandbox.stats()["keys"].items()}


@pytest.mark.parametrize(
    "sandbox", [Faults(seed=3, throttle_rate=0.2, retry_after=1, fail_rate=0.1)], indirect=True
)
def test_throttled_and_unavailable_all_sent_once_never_before_retry_after(
    ws: Workspace, sandbox: Sandbox, fast_waits: float
) -> None:
    """200 notifications through 20% 429 (Retry-After 1) and 10% 503: all sent, each key
    committed once, and no attempt on the channel starts before a Retry-After elapsed (as
    the test switch scales it: some 40 of them, 50 s of real waiting otherwise)."""
    configure(ws, sandbox, idempotent=True, status=True)
    result = send(ws, 200)
    assert result.exit_code == 0, result.output
    assert commits(sandbox) == {key: 1 for key in keys(ws).values()}
    attempts = ws.ledger.attempts()
    retry_afters = ws.ledger.retry_afters()
    throttled = [a for a in attempts if a.http_status == 429]
    assert throttled, "the seed should produce some 429s"
    assert any(a.http_status == 503 for a in attempts)
    # An attempt claimed by a commit that began before a sender's 429 closed the gate is
    # released at the sender's gate check, its request never started: not a start.
    starts = [datetime.fromisoformat(a.started_at) for a in attempts if a.outcome != "not_started"]
    for attempt in throttled:
        retry_after = retry_afters[(attempt.seq, attempt.n)]
        assert retry_after == 1.0  # what the downstream said is stored as it said it
        assert attempt.finished_at is not None
        done = datetime.fromisoformat(attempt.finished_at)
        # The gate counts from the moment the answer came, a little before finished_at is
        # read (the sender closes the gate first): milliseconds, tens of them on a loaded
        # machine, which the scaled wait (a fraction of the real one) does not dwarf.
        # Without the gate, starts come right after the 429: some of the 40 or so would
        # still fall short of 0.8 of it.
        waited = 0.8 * waits.scaled(retry_after)
        gaps = [(s - done).total_seconds() for s in starts if done < s]
        too_early = [gap for gap in gaps if gap < waited]
        assert too_early == [], f"the whole channel waits out a Retry-After ({waited:.3f} s)"
    assert ws.status()["counts"]["sent"] == 200


@pytest.mark.parametrize("sandbox", [Faults(seed=5, drop_rate=0.2)], indirect=True)
def test_dropped_answers_on_an_idempotent_channel_are_retried_under_the_same_key(
    ws: Workspace, sandbox: Sandbox
) -> None:
    """Commit-then-drop on a key-honouring downstream: all sent, each key committed once, the
    retries answered as replays."""
    configure(ws, sandbox, idempotent=True, status=False)
    result = send(ws, 100)
    assert result.exit_code == 0, result.output
    assert commits(sandbox) == {key: 1 for key in keys(ws).values()}
    assert sandbox.stats()["totals"]["replays"] > 0
    retried = len([a for a in ws.ledger.attempts() if a.outcome == "uncertain"])
    assert retried == sandbox.stats()["totals"]["replays"]


@pytest.mark.parametrize(
    "sandbox", [Faults(seed=5, drop_rate=0.2, idempotent=False)], indirect=True
)
def test_dropped_answers_without_idempotency_or_query_become_unknown(
    ws: Workspace, sandbox: Sandbox
) -> None:
    """Neither idempotent nor queryable: a dropped answer is never re-sent; the item is
    reported unknown and the run exits 3."""
    configure(ws, sandbox, idempotent=False, status=False)
    result = send(ws, 100)
    assert result.exit_code == 3, result.output
    assert set(commits(sandbox).values()) == {1}
    assert len(commits(sandbox)) == 100
    report = json.loads(ws.invoke("report", "--format", "json").output)
    unknown = [i for i in report["items"] if i["state"] == "unknown"]
    assert unknown and report["counts"]["unknown"] == len(unknown)
    assert report["counts"]["sent"] + len(unknown) == 100
    assert all(i["attempts"] == 1 for i in unknown)


@pytest.mark.parametrize("sandbox", [Faults(seed=9, error_rate=0.2)], indirect=True)
def test_server_errors_on_a_queryable_non_idempotent_channel_are_queried_first(
    ws: Workspace, sandbox: Sandbox
) -> None:
    """After a 500 the channel is asked by key before anything is re-sent: all sent, each key
    committed once."""
    # The sandbox's 500 commits nothing, at once: a 404 half a second after it is as good a
    # proof as one 5 s after (the default query_delay, there for receivers that commit late;
    # tests/engine/test_query_delay.py pins that), and the run no longer idles 5 s per revisit.
    configure(ws, sandbox, idempotent=False, status=True, extra="query_delay = 0.5\n")
    result = send(ws, 60)
    assert result.exit_code == 0, result.output
    assert commits(sandbox) == {key: 1 for key in keys(ws).values()}
    assert any(a.http_status == 500 for a in ws.ledger.attempts())


def test_crash_after_send_is_found_by_query_and_not_posted_again(
    ws: Workspace, sandbox: Sandbox
) -> None:
    """Crash after item 20 reached the sandbox: resume finds it by key; the sandbox saw one
    commit and no replay for it."""
    configure(ws, sandbox, idempotent=True, status=True)
    ws.write_csv("batch.csv", make_rows(40))
    crash_invoke(ws, "after-send:20", "send", "batch.csv", "--channel", "hooks")
    key = keys(ws)[20]
    resumed = ws.invoke("resume")
    assert resumed.exit_code == 0, resumed.output
    assert f"item 20 (u20) key {key}: receipt found" in resumed.stdout
    assert sandbox.stats()["keys"][key] == {"commits": 1, "replays": 0, "refused": 0}
    assert commits(sandbox) == {k: 1 for k in keys(ws).values()}


@pytest.mark.parametrize("sandbox", [Faults(force_status={"u3": 400})], indirect=True)
def test_bad_request_fails_without_retry(ws: Workspace, sandbox: Sandbox) -> None:
    """A 400 is permanent: the item fails after one attempt, the rest are sent, exit 3."""
    configure(ws, sandbox, idempotent=True, status=True)
    result = send(ws, 5)
    assert result.exit_code == 3
    states = ws.ledger.states()
    assert states == {"u1": "sent", "u2": "sent", "u3": "failed", "u4": "sent", "u5": "sent"}
    assert len(ws.ledger.attempts(seq=3)) == 1


@pytest.mark.parametrize("sandbox", [Faults(force_status={"u3": 410})], indirect=True)
def test_gone_endpoint_halts_the_run(ws: Workspace, sandbox: Sandbox) -> None:
    """A 410 fails the item and halts the run: nothing after it is attempted."""
    configure(ws, sandbox, idempotent=True, status=True)
    result = send(ws, 6)
    assert result.exit_code == 3, result.output
    assert "halted" in result.output
    status = ws.status()
    assert status["state"] == "halted"
    assert status["counts"] == {"total": 6, "sent": 2, "unknown": 0, "pending": 3, "failed": 1,
                                "in_flight": 0, "expired": 0, "suppressed": 0}  # fmt: skip
    assert [a for a in ws.ledger.attempts() if a.seq > 3] == []


@pytest.mark.parametrize("sandbox", [Faults(force_status={"u2": 422})], indirect=True)
def test_conflict_fails_the_item_records_it_and_refuses_to_continue(
    ws: Workspace, sandbox: Sandbox
) -> None:
    """422 on a key: the item is failed with the conflict recorded, never overwritten; the
    run halts and the command exits 4 (refused for safety)."""
    configure(ws, sandbox, idempotent=True, status=True)
    result = send(ws, 4)
    assert result.exit_code == 4, result.output
    item = next(i for i in ws.status()["items"] if i["id"] == "u2")
    assert item["state"] == "failed"
    assert "conflict" in item["last_error"]
    assert ws.status()["state"] == "halted"


@pytest.mark.parametrize(
    "sandbox", [Faults(seed=1, drop_rate=1.0, idempotent=False)], indirect=True
)
def test_five_unknowns_in_a_row_halt_the_run(ws: Workspace, sandbox: Sandbox) -> None:
    """A downstream that accepts but never answers is not fed the whole batch: after 5
    unknown outcomes in a row the run halts."""
    configure(ws, sandbox, idempotent=False, status=False)
    result = send(ws, 20)
    assert result.exit_code == 3
    status = ws.status()
    assert status["state"] == "halted"
    assert status["counts"]["unknown"] == 5
    assert status["counts"]["pending"] == 15
    assert sandbox.stats()["totals"]["commits"] == 5


@pytest.mark.parametrize(
    "sandbox", [Faults(seed=1, throttle_rate=1.0, retry_after=3600)], indirect=True
)
def test_retry_after_beyond_max_wait_pauses_the_run(ws: Workspace, sandbox: Sandbox) -> None:
    """A Retry-After longer than --max-wait pauses the run (exit 3) and says when to resume;
    nothing is retried early."""
    configure(ws, sandbox, idempotent=True, status=True)
    result = send(ws, 3, "--max-wait", "5")
    assert result.exit_code == 3, result.output
    assert "notifier resume" in result.output
    status = ws.status()
    assert status["state"] == "paused"
    assert status["paused_until"] is not None
    assert len(ws.ledger.attempts()) == 1
    again = ws.invoke("resume", "--max-wait", "5")
    assert again.exit_code == 3
    assert len(ws.ledger.attempts()) == 1


def test_signed_requests_verify_and_no_secret_is_stored_or_printed(
    ws: Workspace, sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every delivery verifies with the secret (and not with another); the secret appears in
    no database byte, no output and no report."""
    monkeypatch.setenv("HOOKS_SECRET", SECRET)
    configure(ws, sandbox, idempotent=True, status=True, extra="")
    toml = (
        (ws.path / "notifier.toml")
        .read_text()
        .replace("timeout = 5", 'timeout = 5\nsecret_env = "HOOKS_SECRET"')
    )
    (ws.path / "notifier.toml").write_text(toml)
    result = send(ws, 10)
    assert result.exit_code == 0, result.output
    deliveries = sandbox.deliveries()
    assert len(deliveries) == 10
    for delivery in deliveries:
        standardwebhooks.Webhook(SECRET).verify(delivery["raw_body"], delivery["headers"])
        with pytest.raises(standardwebhooks.WebhookVerificationError):
            standardwebhooks.Webhook("whsec_" + "B" * 32).verify(
                delivery["raw_body"], delivery["headers"]
            )
    outputs = [result.output]
    for args in (["status"], ["status", "--json"], ["runs"]):
        outputs.append(ws.invoke(*args).output)
    for fmt in ("table", "json", "csv"):
        outputs.append(ws.invoke("report", "--format", fmt).output)
    secret_body = SECRET.removeprefix("whsec_")
    for text in outputs:
        assert secret_body not in text
    for path in ws.path.glob("receipts.db*"):
        assert secret_body.encode() not in path.read_bytes()
    assert "HOOKS_SECRET" in str(ws.ledger.channel_snapshot())


def test_resume_uses_the_snapshot_and_reports_a_changed_url(
    ws: Workspace, sandbox: Sandbox
) -> None:
    """After the config file changed the channel URL, resume says so and keeps sending to
    the URL the run was planned with."""
    configure(ws, sandbox, idempotent=True, status=True)
    ws.write_csv("batch.csv", make_rows(10))
    crash_invoke(ws, "after-receipt:4", "send", "batch.csv", "--channel", "hooks")
    toml = ws.path / "notifier.toml"
    toml.write_text(toml.read_text().replace(sandbox.url, "http://127.0.0.1:9"))
    resumed = ws.invoke("resume")
    assert resumed.exit_code == 0, resumed.output
    assert "http://127.0.0.1:9" in resumed.output and "keeps its planned value" in resumed.output
    assert len(commits(sandbox)) == 10
    toml.write_text("")  # the channel is gone from the file altogether
    assert ws.invoke("status").exit_code == 0


@pytest.mark.both_stores
@pytest.mark.parametrize("sandbox", [Faults(error_rate=1.0)], indirect=True)
def test_an_idempotent_webhook_without_status_url_answering_500_until_attempts_run_out_is_unknown(
    ws: Workspace, sandbox: Sandbox
) -> None:
    """An idempotent webhook without status_url, 500 until attempts run out: unknown, not failed."""
    webhook_config(ws, sandbox, status=False, max_attempts=3)
    ws.write_csv("batch.csv", make_rows(2))
    result = ws.invoke("send", "batch.csv", "--channel", "hooks")
    assert result.exit_code == 3, result.output
    items = ws.ledger.items()
    assert [(i.seq, i.state, i.attempts) for i in items] == [(1, "unknown", 3), (2, "unknown", 3)]
    assert all("may have been delivered" in (i.last_error or "") for i in items)
    assert [(a.seq, a.http_status) for a in ws.ledger.attempts()] == [(1, 500)] * 3 + [(2, 500)] * 3
    assert ws.ledger.receipt_count() == 0
    assert sandbox.stats()["totals"]["requests"] == 6
    assert ws.status()["counts"]["failed"] == 0
