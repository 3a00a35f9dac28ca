"""Send windows, a start time and rates per recipient domain, through the real
CLI against a loopback receiver (and the sandbox), on SQLite and PostgreSQL."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from notifier.domain import clock
from notifier.sandbox.server import Sandbox

from ..conftest import Workspace, make_rows, smtp_server
from ..crash.test_workers import configure, finish, notifier
from ..receiver import Receiver, receiving, webhook_config
from ..support.crashed import crash_send
from ..support.smtp import HeldGreeting

pytestmark = pytest.mark.both_stores
DAY_NAMES = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
# From a request's start to its arrival at the receiver, on a loaded two-core machine.
TRANSIT_S = 0.5
ZONE = "Asia/Kolkata"  # +05:30, so a window read in UTC would be hours off


@pytest.fixture
def receiver(ws: Workspace) -> Iterator[Receiver]:
    with receiving(Receiver()) as running:
        (ws.path / "notifier.toml").write_text(
            webhook_config(running, idempotent=True, status=True)
        )
        yield running


def window_from(start: datetime, seconds: int, tz: str) -> str:
    """A one-range window on `tz`'s wall clock from `start` for `seconds` (it may cross
    midnight: a range whose end is before its start ends the next day)."""
    local = start.astimezone(ZoneInfo(tz))
    end = local + timedelta(seconds=seconds)
    return f"{DAY_NAMES[local.weekday()]} {local:%H:%M:%S}-{end:%H:%M:%S}"


@pytest.mark.slow
@pytest.mark.parametrize("concurrency", [1, 8])
def test_a_window_keeps_every_send_inside_it(
    ws: Workspace, receiver: Receiver, concurrency: int
) -> None:
    """A window opening 3 s after the send and open for 3 s, at --rate 5 for 40 rows: nothing
    arrives before it opens or after it closes (items claimed ahead wait for a token past
    its end, and are not started); the rest wait for next week's window, so the run pauses
    (exit 3) saying so."""
    opens = (datetime.now(UTC) + timedelta(seconds=3)).replace(microsecond=0)
    closes = opens + timedelta(seconds=3)
    batch = ws.write_csv("b.csv", make_rows(40))
    result = ws.invoke(
        "send", str(batch), "--channel", "hooks", "--window", window_from(opens, 3, ZONE),
        "--tz", ZONE, "--rate", "5", "--concurrency", str(concurrency), "--max-wait", "30",
    )  # fmt: skip
    assert result.exit_code == 3, result.output
    assert "wait for their start time or send window" in result.output
    arrived = [a.wall for a in receiver.arrivals]
    assert 5 <= len(arrived) < 40
    # A send starts only while the window is open (checked right before the request); the
    # request reaches the receiver a moment later, so the end gets a transit allowance.
    assert min(arrived) >= opens.timestamp()
    assert max(arrived) < closes.timestamp() + TRANSIT_S
    status = ws.status()
    assert status["counts"]["pending"] == status["waiting"]["count"] == 40 - len(arrived)
    assert "wait for their start time or send window until" in status["stop_reason"]
    first = datetime.fromisoformat(status["waiting"]["next_opens_at"])
    assert first == opens + timedelta(days=7)  # next week's window, to the second
    table = ws.invoke("status")
    assert f"{40 - len(arrived)} pending item(s) wait for their start time" in table.stdout


@pytest.mark.parametrize("n", [1, 4])
@pytest.mark.timeout(60)
def test_a_window_closing_while_the_relay_greets_sends_nothing(
    ws: Workspace, n: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The window closes while every sender waits for the relay's greeting (EHLO held until
    all N wait at it; meanwhile this process's clock moves two hours on, past the end of a
    window open for the hour from now): once the connection is ready, the last check
    before MAIL FROM sees it closed, so the relay accepts no message; the items wait,
    never attempted, for next week's window, and the run pauses (exit 3)."""

    def window_closes() -> None:
        monkeypatch.setattr(clock, "_SHIFT", timedelta(hours=2))

    relay = HeldGreeting(n, window_closes)
    with smtp_server(ws, relay, "timeout = 60\n"):
        window = window_from(datetime.now(UTC), 3600, ZONE)
        result = ws.invoke(
            "send", str(ws.write_csv("b.csv", make_rows(n))), "--channel", "mail",
            "--window", window, "--tz", ZONE, "--concurrency", str(n), "--max-wait", "30",
        )  # fmt: skip
    assert relay.most_waiting == n, "not every sender was mid-greeting when the window closed"
    assert result.exit_code == 3, result.output
    assert relay.messages == [], "a message was handed over after its window closed"
    assert [(i.state, i.attempts) for i in ws.ledger.items()] == [("pending", 0)] * n
    assert {a.outcome for a in ws.ledger.attempts()} == {"not_started"}
    assert "wait for their start time or send window" in result.output


def test_not_before_holds_after_kill_and_resume(
    ws: Workspace, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows 3-5 may not go before a not_before (naive, in their own tz) an hour ahead: the
    send crashes after row 2 and is resumed at once, which sends none of them and pauses
    (exit 3) with them waiting; resumed once that hour has passed, it sends each once."""
    start = (datetime.now(UTC) + timedelta(hours=1)).replace(microsecond=0)
    local = start.astimezone(ZoneInfo(ZONE)).replace(tzinfo=None).isoformat()
    rows = make_rows(5)
    rows[0] += ["not_before", "tz"]
    for i, row in enumerate(rows[1:], start=1):
        row.extend([local, ZONE] if i >= 3 else ["", ""])
    batch = ws.write_csv("b.csv", rows)
    crash_send("after-receipt:2", batch, db=ws.db, channel="hooks")
    early = ws.invoke("resume", "--max-wait", "1")
    assert early.exit_code == 3, early.output
    assert sorted(a.item_id for a in receiver.arrivals) == ["u1", "u2"]
    assert {i.item_id: i.state for i in ws.ledger.items()} == {
        "u1": "sent", "u2": "sent", "u3": "pending", "u4": "pending", "u5": "pending"
    }  # fmt: skip
    monkeypatch.setattr(clock, "_SHIFT", timedelta(hours=1, seconds=1))
    resumed = ws.invoke("resume", "--max-wait", "30")
    assert resumed.exit_code == 0, resumed.output
    assert sorted(a.item_id for a in receiver.arrivals) == [f"u{i}" for i in range(1, 6)]


@pytest.mark.parametrize(
    ("args", "cells", "said"),
    [
        (["--window", "Mon 09:00-25:00"], None, "--window"),
        (["--window", "Someday 09:00-10:00"], None, "--window"),
        (["--tz", "Mars/Olympus"], None, "--tz"),
        (["--not-before", "tomorrow"], None, "--not-before"),
        ([], ("Mars/Olympus", ""), "line 3: `tz`"),
        ([], ("UTC", "soon"), "line 3: `not_before`"),
    ],
)
def test_bad_window_or_zone_exits_2_and_stores_nothing(
    ws: Workspace,
    receiver: Receiver,
    args: list[str],
    cells: tuple[str, str] | None,
    said: str,
) -> None:
    """A bad --window, --tz or --not-before, or a bad `tz` or `not_before` cell, is exit 2
    naming it (and the line), with nothing stored and nothing sent."""
    rows = make_rows(2)
    if cells is not None:
        rows[0] += ["tz", "not_before"]
        rows[1] += ["UTC", ""]
        rows[2] += list(cells)
    batch = ws.write_csv("b.csv", rows)
    result = ws.invoke("send", str(batch), "--channel", "hooks", *args)
    assert result.exit_code == 2, result.output
    assert said in result.output
    assert "Traceback" not in result.output
    assert not ws.has_database() or ws.ledger.runs() == []
    assert receiver.arrivals == []


def test_a_bad_channel_window_exits_2(ws: Workspace, receiver: Receiver) -> None:
    """A channel's `window` that is not one is refused with the configuration: exit 2."""
    toml = ws.path / "notifier.toml"
    toml.write_text(toml.read_text().replace("[retry]", 'window = "Mon 9-5"\n[retry]', 1))
    result = ws.invoke("send", str(ws.write_csv("b.csv", make_rows(1))), "--channel", "hooks")
    assert result.exit_code == 2, result.output
    assert "window" in result.output
    assert receiver.arrivals == []


@pytest.mark.slow
def test_the_domain_rate_holds_across_two_workers(ws: Workspace) -> None:
    """`"gmail.com" = 4` on the channel, 24 gmail.com rows among 48, two workers of 4
    senders on PostgreSQL (one process of 8 on SQLite, whose buckets are the process's):
    tokens taken in any second are at most 4 + 4 (a full bucket of max(1, rate) = 4
    tokens, plus 4 refilled in that second), so arrivals within one second, whose tokens
    were taken within 1 + TRANSIT_S seconds, are at most 4 + 4 * 1.5 = 10, and all 24 span at
    least (24 - 4) / 4 - TRANSIT_S = 4.5 s; a bucket per worker would let 16 through in the
    first second, and no bucket all 24."""
    with Sandbox() as sandbox:
        configure(ws, sandbox)
        toml = ws.path / "notifier.toml"
        toml.write_text(
            toml.read_text().replace(
                "[retry]", '[channels.hooks.domain_rates]\n"GMail.com" = 4\n[retry]', 1
            )
        )
        rows = make_rows(48)
        for row in rows[1::2]:
            row[1] = row[1].replace("example.com", "gmail.com")
        ws.write_csv("batch.csv", rows)
        db = str(ws.db)
        # Planned and approved in-process: only the workers sharing the run need processes.
        planned = ws.invoke(
            "send", "batch.csv", "--channel", "hooks", "--run-id", "d1", "--require-approval"
        )
        assert planned.exit_code == 0, planned.output
        lines = planned.output.splitlines()
        fingerprint = next(line.split()[-1] for line in lines if "fingerprint:" in line)
        approved = ws.invoke("approve", "d1", "--fingerprint", fingerprint)
        assert approved.exit_code == 0, approved.output
        if ws.store == "postgres":
            workers = [notifier(ws, db, "worker", "d1", "--concurrency", "4") for _ in range(2)]
        else:  # one process works a SQLite run
            workers = [notifier(ws, db, "resume", "d1", "--concurrency", "8")]
        ended = [finish(worker) for worker in workers]
        # The worker that closes the run exits 0; one that left it to the other, still
        # sending it, exits 3 (stopped, not done).
        assert 0 in [code for code, _ in ended] and all(c in (0, 3) for c, _ in ended), ended
        deliveries = sandbox.deliveries()
    assert len(deliveries) == 48
    gmail = sorted(
        datetime.fromisoformat(d["committed_at"]).timestamp()
        for d in deliveries
        if "@gmail.com" in d["raw_body"]
    )
    assert len(gmail) == 24
    burst, rate = 4, 4
    bound = burst + rate * (1 + TRANSIT_S)
    for i, first in enumerate(gmail):
        within = sum(1 for t in gmail[i:] if t < first + 1)
        assert within <= bound, f"{within} gmail.com requests within a second"
    assert gmail[-1] - gmail[0] >= (24 - burst) / rate - TRANSIT_S


def test_a_changed_start_time_is_not_a_changed_row(ws: Workspace, receiver: Receiver) -> None:
    """The same rows sent again with a `not_before` and a window are the same intents (same
    digests): --resend-changed sends none of them again."""
    rows = make_rows(3)
    first = ws.invoke("send", str(ws.write_csv("a.csv", rows)), "--channel", "hooks")
    assert first.exit_code == 0, first.output
    digests = [i.intent_digest for i in ws.ledger.items()]
    rows[0] += ["not_before", "tz"]
    for row in rows[1:]:
        row.extend(["2020-01-01T09:00:00", "Europe/Paris"])
    changed = ws.invoke(
        "send", str(ws.write_csv("b.csv", rows)), "--channel", "hooks", "--resend-changed",
        "--window", "Mon-Sun 00:00-24:00",
    )  # fmt: skip
    assert changed.exit_code == 0, changed.output
    assert "3 row(s) already delivered with the same content" in changed.stdout
    assert len(receiver.arrivals) == 3, changed.output
    assert [i.intent_digest for i in ws.ledger.items() if i.seq <= 3][:3] == digests


def test_a_row_whose_window_opens_after_its_deadline_is_reported(
    ws: Workspace, receiver: Receiver
) -> None:
    """A row whose deadline comes before its window next opens is named in a warning when
    planning (the row without a deadline is not), and nothing is sent while the window is
    shut: the run pauses, its next opening past --max-wait."""
    soon = (datetime.now(UTC) + timedelta(seconds=2)).replace(microsecond=0)
    shut = window_from(soon + timedelta(hours=2), 60, "UTC")
    rows = make_rows(2)
    rows[0].append("not_after")
    rows[1].append(soon.isoformat())
    rows[2].append("")
    result = ws.invoke(
        "send", str(ws.write_csv("b.csv", rows)), "--channel", "hooks", "--window", shut,
        "--max-wait", "1",
    )  # fmt: skip
    out = result.output
    assert "1 row(s) cannot be sent before their not_after" in out and "line(s) 2" in out
    assert result.exit_code == 3, out
    assert receiver.arrivals == []


def test_a_window_closing_mid_run_does_not_pause_the_items_of_other_channels(
    ws: Workspace, receiver: Receiver
) -> None:
    """Items of a channel without a window are sent even after another channel's closed."""
    now = datetime.now(UTC).replace(microsecond=0)
    soon = window_from(now - timedelta(seconds=1), 3, "UTC")  # closes 2 s from now
    later = window_from(now + timedelta(hours=1), 60, "UTC")  # beyond --max-wait
    config = webhook_config(receiver, idempotent=True, status=True)
    for name, window in (("soon", soon), ("later", later)):
        config += (
            f'\n[channels.{name}]\ntype = "webhook"\nurl = "{receiver.url}/notifications"\n'
            f'idempotent = true\nwindow = "{window}"\n'
        )
    (ws.path / "notifier.toml").write_text(config)
    rows = [["id", "to", "subject", "body", "channel"]]
    channels = ["soon"] * 8 + ["hooks"] * 6 + ["later"]
    for i, channel in enumerate(channels, start=1):
        rows.append([f"u{i}", f"user{i}@example.com", f"Hello {i}", f"Body {i}", channel])
    batch = ws.write_csv("b.csv", rows)
    result = ws.invoke(
        "send", str(batch), "--rate", "2", "--concurrency", "1", "--max-wait", "5",
    )  # fmt: skip
    assert result.exit_code == 3, result.output  # `later` waits: a pause
    sent = Counter(i.channel for i in ws.ledger.items() if i.state == "sent")
    assert sent.get("hooks") == 6, (sent, result.output)
