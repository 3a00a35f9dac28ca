"""With --log-format json, stderr is the log a pipeline parses: every line one JSON object
(notifier/observe/logs.py; a failure is an `error` event, group.py). A planning warning
(rows whose send window opens only after their not_after) was written there as prose, one
line no JSON reader parses, ahead of the `plan` event. It is a `warning` event, naming the
rows by their lines, as the text log says it."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from ..conftest import Workspace

pytestmark = [pytest.mark.timeout(60), pytest.mark.both_stores]


def test_a_planning_warning_is_a_json_event(ws: Workspace) -> None:
    (ws.path / "notifier.toml").write_text('[channels.files]\ntype = "outbox"\n')
    now = datetime.now(UTC)
    opens = now + timedelta(hours=3)  # the window opens after every row's deadline
    window = f"Mon-Sun {opens:%H}:00-{opens:%H}:30"
    not_after = (now + timedelta(minutes=30)).isoformat(timespec="seconds")
    ws.write_csv("b.csv", [["to", "subject", "body"], ["ann@example.com", "Hi", "B"]])
    sent = ws.invoke(
        "send", "b.csv", "--channel", "files", "--tz", "UTC", "--window", window,
        "--not-after", not_after, "--log-format", "json",
    )  # fmt: skip
    assert sent.exit_code == 3, sent.output  # paused: the window opens later
    events = [json.loads(line) for line in sent.stderr.splitlines()]
    warnings = [e for e in events if e["event"] == "warning"]
    assert len(warnings) == 1, events
    assert "line(s) 2" in warnings[0]["message"] and "not_after" in warnings[0]["message"]
    assert {"plan", "pause"} <= {e["event"] for e in events}, events


@pytest.mark.parametrize("separator", ["\u2028", "\u2029"])
def test_a_body_holding_a_unicode_line_separator_keeps_each_event_on_one_line(
    ws: Workspace, separator: str
) -> None:
    """A body holding U+2028 or U+2029 (a body may: an id, a recipient or a subject may
    not), logged with --log-bodies: valid JSON unescaped, but every reader that splits lines
    as Unicode does (Python's str.splitlines, many log shippers) would cut the event in two.
    Each is written escaped, so every line of stderr is one JSON object."""
    (ws.path / "notifier.toml").write_text('[channels.files]\ntype = "outbox"\n')
    body = f"first{separator}second"
    rows = [["id", "to", "subject", "body"], ["a1", "ann@example.com", "Hi", body]]
    ws.write_csv("b.csv", rows)
    sent = ws.invoke("send", "b.csv", "--channel", "files", "--log-format", "json", "--log-bodies")
    assert sent.exit_code == 0, sent.output
    events = [json.loads(line) for line in sent.stderr.splitlines()]
    assert [e["body"] for e in events if e["event"] == "attempt_started"] == [body]
