"""Watching a run from outside: the --metrics-port endpoint scraped mid-run agrees with
`status` and `notifier metrics`, no label carries a recipient, key, item id or subject,
every --log-format json line parses and carries its fields, bodies and recipients (even one
a relay echoes in its refusal) only with --log-bodies, a port in use is exit 2 before
anything is stored. Through the real CLI, at N = 1 and N = 8, on both stores, against a
receiver on 127.0.0.1 that holds every answer until released."""

from __future__ import annotations

import json
import socket
import threading
import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ..conftest import EXAMPLE, Workspace, free_port, make_rows, smtp_server, wait_for
from ..engine.test_suppression import Relay
from ..receiver import WAIT_S, HoldAfter, Receiver, receiving, webhook_config
from .test_startup import loaded_by

pytestmark = pytest.mark.both_stores

# Fields every event about one item's attempt carries.
ITEM_FIELDS = {"ts", "event", "run_id", "seq", "item", "key", "channel", "attempt"}


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text: str = answer.read().decode("utf-8")
        return text


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition: (name, sorted labels) → value."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def item_counts(text: str, run_id: str) -> dict[str, int]:
    """notifier_items of `run_id`, state → count."""
    return {
        s.labels["state"]: int(s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "notifier_items" and s.labels["run_id"] == run_id
    }


def db_figures(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The samples that come from the database (what `notifier metrics` prints too)."""
    return {
        k: v
        for k, v in samples(text).items()
        if not k[0].startswith(("notifier_sends", "notifier_attempt_duration", "notifier_rate"))
        and not k[0].startswith("notifier_channel_gated")
    }


def status_counts(ws: Workspace, run_id: str) -> dict[str, int]:
    result = ws.invoke("status", run_id, "--json")
    assert result.exit_code == 0, result.output
    counts: dict[str, int] = json.loads(result.output)["counts"]
    counts.pop("total")
    return counts


def private_texts(ws: Workspace, rows: list[list[str]]) -> set[str]:
    """What no label may ever carry: recipients, item ids, subjects, bodies, keys."""
    texts = {value for row in rows[1:] for value in row[:4]}
    texts |= set(ws.ledger.keys())
    return texts


def json_lines(stderr: str) -> list[dict[str, Any]]:
    """Every stderr line as JSON (one that does not parse fails the test)."""
    return [json.loads(line) for line in stderr.splitlines()]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("n", [1, 8])
def test_metrics_scraped_mid_run_agree_with_status(ws: Workspace, n: int) -> None:
    """While every sender waits for an answer (the run provably mid-way: items in flight and
    items pending), the endpoint's items by state equal `status --json` and `notifier
    metrics` taken at that moment, no label carries private text; after the run every
    stderr line is a JSON event with its fields, and no subject or body is among them."""
    answered = 2  # answered at once; every later request is held
    hold = HoldAfter(answered)
    receiver = Receiver(hold=hold)
    rows = make_rows(4 * n + 3)
    port = free_port()
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(receiver, idempotent=True, status=True)
        )
        ws.write_csv("batch.csv", rows)
        process = ws.popen(
            "send", "batch.csv", "--channel", "hooks", "--concurrency", str(n),
            "--run-id", "watched", "--metrics-port", str(port), "--log-format", "json",
        )  # fmt: skip
        try:
            receiver.wait_for(lambda r: len(r.arrivals) == answered + n)
            # Recorded: their commit claimed the items after them too; nothing moves now.
            wait_for(
                lambda: ws.ledger.state_counts().get("sent") == answered,
                "the answered items recorded",
            )
            first = scrape(port)
            status = status_counts(ws, "watched")
            printed = ws.invoke("metrics", "watched")
            second = scrape(port)
            hold.set()
            out, err = process.communicate(timeout=60)
        finally:
            hold.set()
            if process.poll() is None:
                process.kill()
                process.communicate()
    assert process.returncode == 0, out + err
    assert item_counts(first, "watched") == status
    assert status["in_flight"] >= n and status["pending"] >= 1, status  # mid-way
    assert printed.exit_code == 0, printed.output
    assert db_figures(printed.output) == db_figures(first) == db_figures(second)
    assert samples(first)[("notifier_unknown_items", (("run_id", "watched"),))] == 0
    assert samples(first)[("notifier_run_state", (("run_id", "watched"), ("state", "running")))]

    sends = (
        "notifier_sends_total",
        (("channel", "hooks"), ("outcome", "sent"), ("run_id", "watched")),
    )
    assert samples(first)[sends] == answered
    durations = (
        "notifier_attempt_duration_seconds_count",
        (("channel", "hooks"), ("run_id", "watched")),
    )
    assert samples(first)[durations] == answered

    private = private_texts(ws, rows)
    labels = {v for (_, pairs) in samples(first) for _, v in pairs}
    assert labels & private == set()

    events = json_lines(err)
    names = [e["event"] for e in events]
    assert names[0] == "plan" and names[-1] == "complete", names
    for kind in ("attempt_started", "answer", "outcome"):
        about = [e for e in events if e["event"] == kind]
        assert len(about) == len(rows) - 1, kind
        assert all(e.keys() >= ITEM_FIELDS for e in about), about[:1]
    assert all(
        "duration_ms" in e and e["outcome"] == "sent" for e in events if e["event"] == "answer"
    )
    assert all(e["run_id"] == "watched" for e in events)
    for row in rows[1:]:
        assert row[1] not in err and row[2] not in err and row[3] not in err

    # After the run, from the database: every attempt counted, by channel and outcome.
    final = ws.invoke("metrics", "watched")
    figures = samples(final.output)
    key = (
        "notifier_attempts_total",
        (("channel", "hooks"), ("outcome", "sent"), ("run_id", "watched")),
    )
    assert figures[key] == len(rows) - 1
    assert item_counts(final.output, "watched") == status_counts(ws, "watched")


def test_log_bodies_adds_recipient_subject_and_body(ws: Workspace) -> None:
    """With --log-bodies each attempt_started carries its recipient, subject and body;
    without it none of them appears anywhere on stderr."""
    bare = ws.invoke("send", str(EXAMPLE), "--run-id", "bare", "--log-format", "json")
    assert bare.exit_code == 0, bare.output
    assert "ada.liskov1@example.org" not in bare.stderr
    assert "Scheduled maintenance" not in bare.stderr
    assert all("subject" not in e for e in json_lines(bare.stderr))
    full = ws.invoke(
        "send", str(EXAMPLE), "--run-id", "full", "--new-run", "--log-format", "json",
        "--log-bodies",
    )  # fmt: skip
    assert full.exit_code == 0, full.output
    started = [e for e in json_lines(full.stderr) if e["event"] == "attempt_started"]
    assert started and all({"to", "subject", "body"} <= e.keys() for e in started)
    assert started[0]["to"] == "ada.liskov1@example.org"
    assert "Scheduled maintenance" in started[0]["subject"]


@pytest.mark.parametrize("command", ["send", "resume"])
def test_a_metrics_port_in_use_is_exit_2_before_anything_is_stored(
    ws: Workspace, command: str
) -> None:
    """A --metrics-port another process listens on: exit 2 naming the port and the fix, no
    traceback, and nothing stored or sent (send stores no run; resume leaves it planned)."""
    if command == "resume":  # an approved run: `resume` alone would send it
        planned = ws.invoke("send", str(EXAMPLE), "--run-id", "later", "--require-approval")
        assert planned.exit_code == 0, planned.output
        fingerprint = ws.ledger.run("later").fingerprint
        assert fingerprint is not None
        approved = ws.invoke("approve", "later", "--fingerprint", fingerprint)
        assert approved.exit_code == 0, approved.output
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        args = [str(EXAMPLE)] if command == "send" else ["later"]
        done = ws.invoke(command, *args, "--metrics-port", str(port))
    assert done.exit_code == 2, done.output
    assert f"--metrics-port {port}" in done.stderr and "free --metrics-port" in done.stderr
    assert "Traceback" not in done.stderr
    if command == "send":
        assert not ws.has_database() or ws.ledger.runs() == []
    else:
        assert ws.ledger.run().state == "approved"
        assert ws.ledger.attempts() == []


def test_status_and_a_plain_send_load_neither_prometheus_client_nor_sqlite_utils(
    ws: Workspace,
) -> None:
    """Imports stay lazy (every command's start-up pays for them): a send without
    --metrics-port, and `status`, never import prometheus_client, nor sqlite-utils (only
    `export` and `verify FILE` need it); `notifier metrics` imports prometheus_client."""
    lazy = ("prometheus_client", "sqlite_utils")
    loaded, _ = loaded_by(ws, "send", str(EXAMPLE))
    assert "notifier.engine.runner" in loaded and not loaded & set(lazy)
    loaded, output = loaded_by(ws, "status")
    assert "completed" in output and not loaded & set(lazy)
    loaded, output = loaded_by(ws, "metrics")
    assert "prometheus_client" in loaded and "notifier_items" in output


@pytest.mark.timeout(90)
def test_throttled_answers_gate_seconds_and_rate_waits_are_counted(ws: Workspace) -> None:
    """A 429 with Retry-After: 1 closes the channel: mid-run the endpoint counts the throttled
    answer, about a second of gate, and the sends that waited for a --rate 1 token; the JSON
    log has the gate event."""
    hold = HoldAfter(2)  # the retry of u1 and u2 answered, u3 held
    receiver = Receiver(
        hold=hold,
        answer=lambda item_id, n: 429 if (item_id, n) == ("u1", 1) else None,
        retry_after="1",
    )
    port = free_port()
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(receiver, idempotent=True, status=True)
        )
        ws.write_csv("batch.csv", make_rows(4))
        process = ws.popen(
            "send", "batch.csv", "--channel", "hooks", "--run-id", "gated", "--rate", "1",
            "--metrics-port", str(port), "--log-format", "json",
        )  # fmt: skip
        try:
            receiver.wait_for(lambda r: len(r.arrivals) == 4)
            wait_for(lambda: ws.ledger.state_counts().get("sent") == 2, "u1 and u2 recorded")
            figures = samples(scrape(port))
            hold.set()
            out, err = process.communicate(timeout=60)
        finally:
            hold.set()
            if process.poll() is None:
                process.kill()
                process.communicate()
    assert process.returncode == 0, out + err
    labels = (("channel", "hooks"), ("run_id", "gated"))
    throttled = (
        "notifier_sends_total",
        (("channel", "hooks"), ("outcome", "throttled"), labels[1]),
    )
    assert figures[throttled] == 1
    assert 0.9 <= figures[("notifier_channel_gated_seconds_total", labels)] <= 5
    assert figures[("notifier_rate_waits_total", labels)] >= 1
    assert figures[("notifier_rate_wait_seconds_total", labels)] > 0.5
    gates = [e for e in json_lines(err) if e["event"] == "gate"]
    assert gates and gates[0]["channel"] == "hooks" and gates[0]["seconds"] >= 0.9


@pytest.mark.timeout(90)
def test_two_workers_endpoints_agree_with_status(ws: Workspace) -> None:
    """A run shared by `send` and a `worker` (PostgreSQL), both holding requests: each
    process's endpoint reports the same database figures as `status` (one truth for the
    fleet), and the worker's JSON log starts with its `worker` event."""
    if ws.store != "postgres":
        pytest.skip("workers share a run through PostgreSQL")
    hold = threading.Event()
    receiver = Receiver(hold=hold)
    ports = free_port(), free_port()
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            # A held request must not time out before the test lets it go (WAIT_S at most):
            # else `send` sends again, and the 3rd and 4th arrivals need not be the worker's.
            webhook_config(receiver, idempotent=True, status=True, timeout=2 * WAIT_S)
        )
        ws.write_csv("batch.csv", make_rows(30))
        first = ws.popen(
            "send", "batch.csv", "--channel", "hooks", "--concurrency", "2", "--run-id", "fleet",
            "--metrics-port", str(ports[0]),
        )  # fmt: skip
        second = None
        try:
            receiver.wait_for(lambda r: len(r.arrivals) == 2)
            second = ws.popen(
                "worker", "fleet", "--concurrency", "2", "--metrics-port", str(ports[1]),
                "--log-format", "json",
            )  # fmt: skip
            receiver.wait_for(lambda r: len(r.arrivals) == 4)
            scraped = [scrape(port) for port in ports]
            status = status_counts(ws, "fleet")
            hold.set()
            results = [p.communicate(timeout=60) for p in (first, second)]
        finally:
            hold.set()
            for process in (first, second):
                if process is not None and process.poll() is None:
                    process.kill()
                    process.communicate()
    # The one that closes the run exits 0; the one that left it to the other, still
    # sending it, 3 (stopped, not done).
    assert sorted([first.returncode, second.returncode]) in ([0, 0], [0, 3]), results
    assert status["in_flight"] >= 4 and status["pending"] >= 1, status
    assert db_figures(scraped[0]) == db_figures(scraped[1])
    assert item_counts(scraped[0], "fleet") == status
    events = json_lines(results[1][1])
    assert events[0]["event"] == "worker" and events[0]["run_id"] == "fleet"


def test_notifier_metrics_on_bad_input_is_exit_2_and_creates_nothing(ws: Workspace) -> None:
    """`notifier metrics` is a look: with no database it creates none, and an unknown run id
    is exit 2 naming it, as `status` does."""
    missing = ws.invoke("metrics")
    assert missing.exit_code == 2 and "database here yet" in missing.stderr
    assert not ws.has_database()
    assert ws.invoke("send", str(EXAMPLE), "--run-id", "known").exit_code == 0
    unknown = ws.invoke("metrics", "nosuch")
    assert unknown.exit_code == 2 and "'nosuch'" in unknown.stderr, unknown.output
    assert "Traceback" not in unknown.stderr


def test_an_error_under_json_logs_is_a_json_event_too(ws: Workspace) -> None:
    """With --log-format json, a command's failure is one more JSON line on stderr (`error`,
    its exit code and message), with the contract's exit code, never prose a log pipeline
    cannot parse; without it, the plain message."""
    result = ws.invoke("resume", "--log-format", "json")
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    event = json.loads(line)
    assert (event["event"], event["exit_code"]) == ("error", 2)
    assert "database here yet" in event["message"] and "ts" in event
    plain = ws.invoke("resume")
    assert plain.exit_code == 2 and plain.stderr.startswith("Error: "), plain.output


@pytest.fixture
def relay(ws: Workspace) -> Any:
    handler = Relay()
    with smtp_server(ws, handler):
        yield handler


@pytest.mark.parametrize("n", [1, 8])
def test_json_log_never_names_a_recipient_rejected_at_rcpt(
    ws: Workspace, relay: Relay, n: int
) -> None:
    """Without --log-bodies no JSON log line carries a recipient, even one a relay echoes."""
    relay.rcpt_answers["user4@example.com"] = "550 5.1.1 <user4@example.com>: no such user"
    ws.write_csv("batch.csv", make_rows(6))
    done = ws.invoke(
        "send", "batch.csv", "--channel", "mail", "--concurrency", str(n),
        "--log-format", "json",
    )  # fmt: skip
    assert done.exit_code == 3, done.output
    lines = [json.loads(line) for line in done.stderr.splitlines()]
    assert any(e.get("attempt_outcome") == "permanent" for e in lines), lines
    assert "user4@example.com" not in done.stderr


def test_a_resume_refused_for_its_approval_logs_no_resume(ws: Workspace) -> None:
    """A resume the run's approval refuses (exit 4) takes nothing up: its JSON log holds the
    refusal alone, no `resume` event counting items as taken up; once approved, the resume
    that sends logs it."""
    planned = ws.invoke("send", str(EXAMPLE), "--run-id", "later", "--require-approval")
    assert planned.exit_code == 0, planned.output
    refused = ws.invoke("resume", "later", "--log-format", "json")
    assert refused.exit_code == 4, refused.output
    assert [e["event"] for e in json_lines(refused.stderr)] == ["error"]
    fingerprint = ws.ledger.run("later").fingerprint
    assert fingerprint is not None
    assert ws.invoke("approve", "later", "--fingerprint", fingerprint).exit_code == 0
    sent = ws.invoke("resume", "later", "--log-format", "json")
    assert sent.exit_code == 0, sent.output
    assert [e["event"] for e in json_lines(sent.stderr)].count("resume") == 1
