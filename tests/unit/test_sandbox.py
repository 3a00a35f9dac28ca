"""The sandbox provider (docs/design.md section 6): Idempotency-Key draft semantics, seeded faults,
keep-alive, and a clean start/stop. Every test runs its own sandbox on an ephemeral port of
127.0.0.1 and talks to it over real HTTP."""

from __future__ import annotations

import _thread
import base64
import hashlib
import json
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx2
import pytest
from standardwebhooks import Webhook

from notifier.sandbox.server import Faults, Sandbox, payload_identity, run_sandbox

from ..conftest import Workspace

# Generous, only so that a broken sandbox makes a test fail instead of hanging.
TIMEOUT = 10.0
DROPPED = (httpx2.RemoteProtocolError, httpx2.ReadError)


def body_for(item_id: str, **extra: Any) -> dict[str, Any]:
    return {
        "to": f"{item_id}@example.com",
        "subject": "Hello",
        "body": "Hi there",
        "data": {},
        "run_id": "run_1",
        "item_id": item_id,
        **extra,
    }


def post(client: httpx2.Client, key: str | None, body: Any, **headers: str) -> httpx2.Response:
    if key is not None:
        headers["Idempotency-Key"] = key
    return client.post("/notifications", json=body, headers=headers)


def client_for(sandbox: Sandbox) -> httpx2.Client:
    return httpx2.Client(base_url=sandbox.url, timeout=TIMEOUT)


@pytest.fixture
def sandbox() -> Iterator[Sandbox]:
    with Sandbox() as running:
        yield running


@pytest.fixture
def client(sandbox: Sandbox) -> Iterator[httpx2.Client]:
    with client_for(sandbox) as http:
        yield http


def test_first_post_commits_a_delivery(sandbox: Sandbox, client: httpx2.Client) -> None:
    """A new key answers 201 with a delivery id, and the delivery is recorded with its body,
    exact raw bytes and lower-cased headers."""
    response = post(client, "key-1", body_for("a"), **{"Notifier-Intent-Digest": "sha256:abc"})

    assert response.status_code == 201
    assert response.json() == {
        "id": "dlv_1",
        "status": "delivered",
        "idempotency_key": "key-1",
        "intent_digest": "sha256:abc",
    }
    assert "idempotent-replayed" not in response.headers
    [delivery] = sandbox.deliveries()
    assert delivery["id"] == "dlv_1"
    assert delivery["idempotency_key"] == "key-1"
    assert delivery["intent_digest"] == "sha256:abc"
    assert delivery["body"] == body_for("a")
    assert json.loads(delivery["raw_body"]) == body_for("a")
    assert delivery["headers"]["idempotency-key"] == "key-1"
    assert delivery["headers"]["notifier-intent-digest"] == "sha256:abc"
    assert datetime.fromisoformat(delivery["committed_at"]).tzinfo is not None
    assert client.get("/deliveries").json() == sandbox.deliveries()


def test_payload_identity_defaults_to_canonical_body_digest(
    sandbox: Sandbox, client: httpx2.Client
) -> None:
    """Without Notifier-Intent-Digest the identity is sha256 of the canonical JSON body, so
    key order and whitespace in the request do not matter."""
    first = client.post(
        "/notifications",
        content=b'{"b": 1, "a": "\xc3\xa9"}',
        headers={"Idempotency-Key": "k", "Content-Type": "application/json"},
    )
    again = client.post(
        "/notifications",
        content='{"a":"é","b":1}'.encode(),
        headers={"Idempotency-Key": "k", "Content-Type": "application/json"},
    )

    digest = "sha256:" + hashlib.sha256('{"a":"é","b":1}'.encode()).hexdigest()
    assert payload_identity({"b": 1, "a": "é"}) == digest
    assert first.status_code == 201
    assert first.json()["intent_digest"] == digest
    assert again.status_code == 201
    assert again.headers["Idempotent-Replayed"] == "true"


def test_replay_returns_the_first_answer(sandbox: Sandbox, client: httpx2.Client) -> None:
    """The same key with the same payload replays the very first status and body, marked
    Idempotent-Replayed, commits nothing new and counts a replay."""
    first = post(client, "key-1", body_for("a"))
    replay = post(client, "key-1", body_for("a"))

    assert replay.status_code == first.status_code == 201
    assert replay.content == first.content
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert len(sandbox.deliveries()) == 1
    assert sandbox.stats()["keys"]["key-1"] == {"commits": 1, "replays": 1, "refused": 0}


def test_intent_digest_header_is_the_payload_identity(
    sandbox: Sandbox, client: httpx2.Client
) -> None:
    """When Notifier-Intent-Digest is sent it alone decides "same payload": equal digests
    replay even if the bytes differ, different digests are refused."""
    digest = {"Notifier-Intent-Digest": "sha256:one"}
    first = post(client, "key-1", body_for("a"), **digest)
    replay = post(client, "key-1", body_for("a", extra="reformatted"), **digest)
    other = post(client, "key-1", body_for("a"), **{"Notifier-Intent-Digest": "sha256:two"})

    assert first.status_code == 201
    assert replay.status_code == 201
    assert replay.json()["id"] == first.json()["id"]
    assert other.status_code == 422


def test_same_key_other_payload_is_refused_and_never_overwrites(
    sandbox: Sandbox, client: httpx2.Client
) -> None:
    """The same key with a different payload answers 422, counts a refusal and leaves the
    stored delivery exactly as it was."""
    post(client, "key-1", body_for("a"))
    before = sandbox.deliveries()

    conflict = post(client, "key-1", body_for("a", subject="Changed"))

    assert conflict.status_code == 422
    assert "error" in conflict.json()
    assert sandbox.deliveries() == before
    lookup = client.get("/notifications/key-1").json()
    assert lookup["intent_digest"] == payload_identity(body_for("a"))
    assert sandbox.stats()["keys"]["key-1"] == {"commits": 1, "replays": 0, "refused": 1}


def start_slow_post(
    sandbox: Sandbox, key: str, results: dict[str, int]
) -> tuple[threading.Thread, httpx2.Response | None]:
    """POST `key` in a thread; return it with the GET-by-key answer that saw the key being
    processed (None if the request completed before that could be observed)."""

    def send() -> None:
        with client_for(sandbox) as http:
            results[key] = post(http, key, body_for(key)).status_code

    thread = threading.Thread(target=send)
    thread.start()
    with client_for(sandbox) as http:
        while True:
            lookup = http.get(f"/notifications/{key}")
            if lookup.status_code == 409:
                return thread, lookup
            if lookup.status_code == 200 or not thread.is_alive():
                return thread, None


def test_retry_while_processing_is_refused_with_409() -> None:
    """While a first POST is in its latency, GET by key answers 409 processing and a second
    POST with the same key answers 409; the first request still commits exactly once."""
    with Sandbox(faults=Faults(latency_ms=300)) as sandbox, client_for(sandbox) as client:
        results: dict[str, int] = {}
        # A noisy machine may stall past the latency window; only then try with a new key.
        for attempt in range(5):
            key = f"slow-{attempt}"
            thread, lookup = start_slow_post(sandbox, key, results)
            concurrent = post(client, key, body_for(key)) if lookup is not None else None
            thread.join(TIMEOUT)
            if lookup is not None and concurrent is not None and concurrent.status_code == 409:
                break
        else:
            pytest.fail("never got a 409 for a key in its processing state")

        assert lookup.json() == {"status": "processing"}
        assert "error" in concurrent.json()
        assert results[key] == 201
        assert client.get(f"/notifications/{key}").status_code == 200
        assert sandbox.stats()["keys"][key] == {"commits": 1, "replays": 0, "refused": 1}


def test_get_by_key_finds_committed_and_not_unknown(
    sandbox: Sandbox, client: httpx2.Client
) -> None:
    """GET /notifications/{key} answers 200 with the first delivery's id and digest for a
    committed key (URL-decoded), and 404 for an unknown one."""
    created = post(client, "key with/slash", body_for("a")).json()
    post(client, "key with/slash", body_for("a"))

    found = client.get("/notifications/key%20with%2Fslash")
    missing = client.get("/notifications/nope")

    assert found.status_code == 200
    assert found.json() == {
        "id": created["id"],
        "idempotency_key": "key with/slash",
        "intent_digest": created["intent_digest"],
        "status": "delivered",
        "deliveries": 1,
    }
    assert missing.status_code == 404
    assert missing.json() == {"error": "not found"}


def test_stats_count_commits_replays_refusals_and_requests(
    sandbox: Sandbox, client: httpx2.Client
) -> None:
    """GET /stats counts per key and in total: commits, replays, refusals, POST requests and
    faulted requests; sandbox.stats() is the same document."""
    post(client, "k1", body_for("1"))
    post(client, "k1", body_for("1"))
    post(client, "k1", body_for("1"))
    post(client, "k1", body_for("other"))
    post(client, "k2", body_for("2"))

    stats = client.get("/stats").json()

    assert stats == sandbox.stats()
    assert stats["keys"] == {
        "k1": {"commits": 1, "replays": 2, "refused": 1},
        "k2": {"commits": 1, "replays": 0, "refused": 0},
    }
    totals = stats["totals"]
    assert (totals["commits"], totals["replays"], totals["refused"]) == (2, 2, 1)
    assert (totals["requests"], totals["faulted"], totals["dropped"]) == (5, 0, 0)


def test_bad_requests_answer_400_and_commit_nothing(
    sandbox: Sandbox, client: httpx2.Client
) -> None:
    """Invalid JSON, a non-object body or a missing Idempotency-Key answer 400 with a JSON
    error; nothing is committed."""
    headers = {"Idempotency-Key": "k", "Content-Type": "application/json"}
    invalid = client.post("/notifications", content=b"{not json", headers=headers)
    not_object = client.post("/notifications", content=b"[1, 2]", headers=headers)
    not_utf8 = client.post("/notifications", content=b'{"a": "\xff"}', headers=headers)
    no_key = post(client, None, body_for("a"))

    for response in (invalid, not_object, not_utf8, no_key):
        assert response.status_code == 400
        assert "error" in response.json()
    assert sandbox.deliveries() == []
    assert sandbox.stats()["totals"]["requests"] == 4


def test_unknown_routes_answer_404(sandbox: Sandbox, client: httpx2.Client) -> None:
    """Any other path or method answers 404, and the connection stays usable."""
    assert client.get("/").status_code == 404
    assert client.get("/notifications").status_code == 404
    assert client.post("/elsewhere", json={}).status_code == 404
    assert client.put("/notifications", json={}).status_code == 404
    assert client.delete("/notifications/k").status_code == 404
    assert client.get("/stats").status_code == 200
    assert sandbox.stats()["totals"]["connections"] == 1


def statuses(faults: Faults, count: int) -> list[int | str]:
    """Status codes of `count` fresh-key POSTs ("dropped" for a dropped connection)."""
    seen: list[int | str] = []
    with Sandbox(faults=faults) as sandbox, client_for(sandbox) as client:
        for n in range(count):
            try:
                seen.append(post(client, f"k{n}", body_for(str(n))).status_code)
            except DROPPED:
                seen.append("dropped")
    return seen


MIXED = Faults(seed=7, throttle_rate=0.1, fail_rate=0.1, error_rate=0.1, drop_rate=0.1)


def test_seeded_faults_are_reproducible() -> None:
    """The same seed gives the same sequence of answers; another seed gives another."""
    first = statuses(MIXED, 60)

    assert statuses(MIXED, 60) == first
    assert statuses(Faults(seed=8, throttle_rate=0.1, fail_rate=0.1, error_rate=0.1), 60) != first


def test_fault_rates_are_roughly_honoured() -> None:
    """Over 400 requests each fault occurs at about its configured rate, faulted answers
    commit nothing, and drops commit."""
    seen = Counter(statuses(MIXED, 400))

    for outcome in (429, 503, 500, "dropped"):
        assert 16 <= seen[outcome] <= 64, seen  # 10% of 400, within about 4 standard deviations
    assert seen[201] == 400 - sum(seen[o] for o in (429, 503, 500, "dropped"))


def test_fault_totals_and_commits_match_answers() -> None:
    """Faulted requests are counted as faulted and commit nothing; drops commit."""
    with Sandbox(faults=MIXED) as sandbox, client_for(sandbox) as client:
        seen: Counter[int | str] = Counter()
        for n in range(100):
            try:
                seen[post(client, f"k{n}", body_for(str(n))).status_code] += 1
            except DROPPED:
                seen["dropped"] += 1
        totals = sandbox.stats()["totals"]

    assert totals["requests"] == 100
    assert totals["faulted"] == seen[429] + seen[503] + seen[500]
    assert totals["dropped"] == seen["dropped"]
    assert totals["commits"] == seen[201] + seen["dropped"]


@pytest.mark.parametrize(("retry_after", "header"), [(1.0, "1"), (0, "0"), (2.5, "3")])
def test_throttled_answers_carry_retry_after(retry_after: float, header: str) -> None:
    """A throttled POST answers 429 with Retry-After in whole seconds (fractions rounded up)
    and is not processed: the same key then commits normally."""
    faults = Faults(throttle_rate=1.0, retry_after=retry_after)
    with Sandbox(faults=faults) as sandbox, client_for(sandbox) as client:
        response = post(client, "k", body_for("a"))

        assert response.status_code == 429
        assert response.headers["Retry-After"] == header
        assert sandbox.deliveries() == []
        assert client.get("/notifications/k").status_code == 404


def test_unavailable_and_errors_have_no_retry_after() -> None:
    """503 and 500 faults carry no Retry-After and commit nothing."""
    for faults, status in ((Faults(fail_rate=1.0), 503), (Faults(error_rate=1.0), 500)):
        with Sandbox(faults=faults) as sandbox, client_for(sandbox) as client:
            response = post(client, "k", body_for("a"))

            assert response.status_code == status
            assert "retry-after" not in response.headers
            assert sandbox.deliveries() == []


def test_drop_commits_then_closes_without_answering() -> None:
    """A drop commits the delivery, then closes the connection with no response bytes; GET
    by key finds the delivery, and a retry on a healthy sandbox would replay it."""
    with Sandbox(faults=Faults(drop_rate=1.0)) as sandbox, client_for(sandbox) as client:
        with pytest.raises(DROPPED):
            post(client, "k", body_for("a"))

        found = client.get("/notifications/k")
        assert found.status_code == 200
        assert found.json()["id"] == "dlv_1"
        [delivery] = sandbox.deliveries()
        assert delivery["idempotency_key"] == "k"
        assert sandbox.stats()["keys"]["k"]["commits"] == 1
        assert sandbox.stats()["totals"]["dropped"] == 1


def test_no_idempotent_mode_commits_every_post() -> None:
    """With idempotent=False every POST is a new delivery, even with the same key and
    another payload; POSTs without a key count under "-"."""
    faults = Faults(idempotent=False)
    with Sandbox(faults=faults) as sandbox, client_for(sandbox) as client:
        first = post(client, "k", body_for("a"))
        second = post(client, "k", body_for("a"))
        third = post(client, "k", body_for("b"))
        keyless = post(client, None, {"version": "1.0", "title": "t", "message": "m"})

        assert [r.status_code for r in (first, second, third, keyless)] == [201] * 4
        assert len({r.json()["id"] for r in (first, second, third, keyless)}) == 4
        assert "idempotent-replayed" not in second.headers
        assert keyless.json()["idempotency_key"] is None
        stats = sandbox.stats()
        assert stats["keys"]["k"] == {"commits": 3, "replays": 0, "refused": 0}
        assert stats["keys"]["-"] == {"commits": 1, "replays": 0, "refused": 0}
        lookup = client.get("/notifications/k").json()
        assert (lookup["id"], lookup["deliveries"]) == (first.json()["id"], 3)


def test_force_status_answers_the_forced_code_and_commits_nothing() -> None:
    """A forced item_id always answers its forced status without committing (and draws no
    fault); other items are processed normally."""
    faults = Faults(force_status={"bad": 422, "gone": 410})
    with Sandbox(faults=faults) as sandbox, client_for(sandbox) as client:
        bad = post(client, "k-bad", body_for("bad"))
        gone = [post(client, "k-gone", body_for("gone")).status_code for _ in range(3)]
        fine = post(client, "k-fine", body_for("fine"))

        assert bad.status_code == 422
        assert "error" in bad.json()
        assert gone == [410, 410, 410]
        assert fine.status_code == 201
        assert [d["body"]["item_id"] for d in sandbox.deliveries()] == ["fine"]
        assert client.get("/notifications/k-bad").status_code == 404
        assert sandbox.stats()["totals"]["faulted"] == 4


def test_keep_alive_reuses_one_connection(sandbox: Sandbox, client: httpx2.Client) -> None:
    """Many requests over one client travel over a single kept-alive connection."""
    for n in range(50):
        assert post(client, f"k{n}", body_for(str(n))).status_code == 201
        assert client.get(f"/notifications/k{n}").status_code == 200

    assert sandbox.stats()["totals"]["connections"] == 1


def test_raw_body_and_headers_verify_a_standard_webhooks_signature(
    sandbox: Sandbox, client: httpx2.Client
) -> None:
    """The recorded raw body and headers are exactly what was sent, so a Standard Webhooks
    signature over the exact bytes verifies."""
    webhook = Webhook(base64.b64encode(b"0123456789abcdef0123456789abcdef").decode())
    payload = '{"to": "a@example.com",  "subject": "Grüße", "item_id": "a"}'
    timestamp = datetime.now(UTC)
    signature = webhook.sign("key-1", timestamp, payload)
    client.post(
        "/notifications",
        content=payload.encode(),
        headers={
            "Idempotency-Key": "key-1",
            "Content-Type": "application/json",
            "webhook-id": "key-1",
            "webhook-timestamp": str(int(timestamp.timestamp())),
            "webhook-signature": signature,
        },
    )

    [delivery] = sandbox.deliveries()
    assert delivery["raw_body"] == payload
    assert webhook.verify(delivery["raw_body"], delivery["headers"])["subject"] == "Grüße"


def test_stop_closes_kept_alive_connections() -> None:
    """stop() returns although a client still holds an idle keep-alive connection, and the
    sandbox then refuses further requests."""
    sandbox = Sandbox().start()
    with client_for(sandbox) as client:
        assert client.get("/stats").status_code == 200
        sandbox.stop()
        sandbox.stop()  # idempotent

        with pytest.raises(httpx2.TransportError):
            client.get("/stats")


def test_serve_forever_returns_after_stop() -> None:
    """serve_forever() blocks serving requests until stop() is called from another thread,
    then returns with the socket closed."""
    sandbox = Sandbox()
    server = threading.Thread(target=sandbox.serve_forever)
    server.start()
    try:
        with client_for(sandbox) as client:
            assert post(client, "k", body_for("a")).status_code == 201
    finally:
        sandbox.stop()
        server.join(TIMEOUT)

    assert not server.is_alive()
    with pytest.raises(httpx2.ConnectError), client_for(sandbox) as client:
        client.get("/stats")


def test_run_sandbox_announces_and_returns_cleanly_on_ctrl_c() -> None:
    """run_sandbox() announces the bound notifications URL, serves, and returns (closing the
    socket) when Ctrl-C raises KeyboardInterrupt in the serving thread."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("KeyboardInterrupt can only be simulated in the main thread")
    announced: list[str] = []
    answers: list[int] = []

    def press_ctrl_c(url: str) -> None:
        try:
            with httpx2.Client(timeout=TIMEOUT) as http:
                answer = http.post(url, json={}, headers={"Idempotency-Key": "k"})
                answers.append(answer.status_code)
        finally:
            _thread.interrupt_main()

    helper: list[threading.Thread] = []

    def announce(message: str) -> None:
        announced.append(message)
        url = message.removeprefix("sandbox listening on ")
        helper.append(threading.Thread(target=press_ctrl_c, args=(url,)))
        helper[0].start()

    # interrupt_main() does nothing while SIGINT is ignored (a suite run as a background
    # job): Python's own Ctrl-C handler for the length of the test.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        run_sandbox("127.0.0.1", 0, Faults(), announce)
    finally:
        signal.signal(signal.SIGINT, previous)
    helper[0].join(TIMEOUT)

    [message] = announced
    assert message.startswith("sandbox listening on http://127.0.0.1:")
    assert message.endswith("/notifications")
    assert not message.endswith(":0/notifications")
    assert answers == [201]
    with pytest.raises(httpx2.ConnectError), httpx2.Client(timeout=TIMEOUT) as http:
        http.get(message.removeprefix("sandbox listening on "))


@pytest.mark.parametrize(
    "faults",
    [
        {"fail_rate": 1.5},
        {"throttle_rate": -0.1},
        {"drop_rate": float("nan")},
        {"fail_rate": 0.6, "error_rate": 0.6},
        {"latency_ms": -1.0},
        {"retry_after": float("inf")},
        {"force_status": {"a": 99}},
    ],
)
def test_invalid_faults_are_rejected(faults: dict[str, Any]) -> None:
    """Out-of-range rates, rates adding up to more than 1, negative latency, a non-finite
    Retry-After and impossible forced statuses raise ValueError."""
    with pytest.raises(ValueError):
        Faults(**faults)


def test_quiesce_returns_once_a_killed_clients_request_is_handled() -> None:
    """`quiesce` waits for the request a client sent before it was killed with SIGKILL:
    the sandbox has read the body and is in its latency when the client dies; once quiesce
    returns, the delivery is committed (the stateful test's checks rely on it)."""
    client = (
        "import sys, httpx2\n"
        "httpx2.post(sys.argv[1], json={'item_id': 'k1'}, headers={'Idempotency-Key': 'k1'},"
        " timeout=60)\n"
    )
    with Sandbox(faults=Faults(latency_ms=1500)) as sandbox:
        proc = subprocess.Popen([sys.executable, "-c", client, sandbox.notifications_url])
        try:
            deadline = time.monotonic() + TIMEOUT
            while (
                sandbox.stats()["totals"]["requests"] < 1
            ):  # the body is read: the latency has begun
                assert proc.poll() is None and time.monotonic() < deadline, "never reached"
                time.sleep(0.005)
        finally:
            proc.kill()
            proc.wait(TIMEOUT)
        assert sandbox.deliveries() == []  # still in its latency
        sandbox.quiesce(timeout=TIMEOUT)
        assert [d["idempotency_key"] for d in sandbox.deliveries()] == ["k1"]


def test_the_sandbox_answers_claudes_messages_api_so_compose_rehearses_offline(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`send --compose` against the sandbox (ANTHROPIC_BASE_URL) drafts every row through
    the real SDK, free and with no network: the drafts are stored, quote their own row, and
    the run sends them."""
    rows = [["id", "to", "name"]] + [[f"u{i}", f"u{i}@example.com", f"User {i}"] for i in (1, 2)]
    batch = ws.write_csv("b.csv", rows)
    brief = ws.path / "brief.txt"
    brief.write_text("Say hello.", "utf-8")
    with Sandbox() as sandbox:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", sandbox.url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sandbox")
        result = ws.invoke("send", str(batch), "--compose", str(brief))
    assert result.exit_code == 0, result.output
    documents = sorted(ws.outbox_documents(), key=lambda d: str(d["item_id"]))
    assert [d["subject"] for d in documents] == ["Sandbox draft", "Sandbox draft"]
    assert '"name":"User 1"' in str(documents[0]["body"])
    assert '"name":"User 2"' in str(documents[1]["body"])
