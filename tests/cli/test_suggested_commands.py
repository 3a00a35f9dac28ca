"""Every command the tool suggests reproduces the options that shaped the run (channel,
template, approval, schedule): following the advice printed after a run, word for word,
retries that run's rows, and never plans the file again on another channel or without its
approval. `runs` names each run's channels, as a table and as JSON."""

from __future__ import annotations

import json
import re
import shlex
from collections import Counter, deque

import pytest
from click.testing import CliRunner

from notifier.cli import cli
from notifier.cli.outcome import send_again

from ..conftest import Workspace, make_rows
from ..engine.test_compose import batch, brief
from ..fake_messages import FakeMessages, text_only_answer
from ..receiver import Receiver, receiving, webhook_config


def test_send_again_repeats_every_option_that_shaped_the_run() -> None:
    """Channel, template, deadline, schedule, approval and duplicates, quoted for a shell."""
    options = {
        "concurrency": 8,
        "channel": "hooks",
        "template_path": "my template.toml",
        "not_after": "2026-12-24T18:00:00+01:00",
        "not_before": "2026-12-24T09:00",
        "tz": "Europe/Paris",
        "window": "Mon-Fri 09:00-18:00",
        "require_approval": True,
        "allow_duplicates": True,
    }
    command = send_again("b 1.csv", options)
    assert shlex.split(command) == [
        "notifier", "send", "b 1.csv", "--channel", "hooks", "--template", "my template.toml",
        "--not-after", "2026-12-24T18:00:00+01:00", "--not-before", "2026-12-24T09:00",
        "--tz", "Europe/Paris", "--window", "Mon-Fri 09:00-18:00", "--require-approval",
        "--allow-duplicates",
    ]  # fmt: skip
    assert send_again("b.csv", {"concurrency": 8, "rate": 5}) == "notifier send b.csv"


@pytest.mark.both_stores
def test_the_advice_after_a_composed_run_drafts_again_with_its_brief(
    ws: Workspace, fake: FakeMessages
) -> None:
    """A `--compose` run with a draft that failed: the advice, followed word for word,
    composes the file again with the same brief and model and sends the one row left,
    never the file's own text for the rows already delivered (which would be refused as
    changed, and sent twice with --resend-changed)."""
    fake.per_row["u2"] = deque([text_only_answer()])
    first = ws.invoke("send", str(batch(ws, 3)), "--compose", str(brief(ws)), "--model",
                      "claude-haiku-4-5", "--compose-columns", "id,name")  # fmt: skip
    assert first.exit_code == 3, first.output
    advised = re.search(r"send the same file again \(`(notifier send [^`]*)`\)", first.output)
    assert advised is not None, first.output
    words = shlex.split(advised.group(1))
    assert words[words.index("--compose") + 1] == str(brief(ws))
    assert words[words.index("--model") + 1] == "claude-haiku-4-5"
    assert words[words.index("--compose-columns") + 1] == "id,name"
    again = ws.invoke(*words[1:])
    assert again.exit_code == 0, again.output
    assert Counter(d["item_id"] for d in ws.outbox_documents()) == {"u1": 1, "u2": 1, "u3": 1}


def test_a_composed_run_stored_without_its_briefs_path_is_advised_with_the_option() -> None:
    """A run stored before its brief's path was kept: the advice still names --compose."""
    options = {"compose": {"brief": "…", "model": "m", "columns": None, "batch_api": False}}
    command = send_again("b.csv", options)
    assert shlex.split(command) == [
        "notifier",
        "send",
        "b.csv",
        "--compose",
        "BRIEF",
        "--model",
        "m",
    ]


@pytest.mark.both_stores
@pytest.mark.parametrize("config", ["./notifier.toml", "--config"])
@pytest.mark.parametrize("placed", ["before", "after"])
@pytest.mark.timeout(60)
def test_the_advice_repeats_the_database_and_channels_the_command_was_given(
    ws: Workspace, placed: str, config: str
) -> None:
    """A run kept in a database named by --db (not ./receipts.db), its channels in
    ./notifier.toml or in a file named by --config, the options before or after the
    subcommand. u2 is refused (400); the advice to send the file again, followed word for
    word in the same shell, works on that database with those channels: u2 is tried again,
    and u1 and u3, delivered, are not sent twice (named without --db, it would plan every row
    again in a new ./receipts.db)."""
    receiver = Receiver(answer=lambda item_id, n: 400 if item_id == "u2" else None)
    (ws.path / "prod").mkdir()
    (ws.path / "conf").mkdir()
    given = ["--db", str(ws.url or ws.path / "prod" / "receipts.db")]
    channels = ws.path / "notifier.toml"
    if config == "--config":
        channels = ws.path / "conf" / "hooks.toml"
        given += ["--config", str(channels)]
    runner = CliRunner()  # the database and channels only as given: no NOTIFIER_DB
    with receiving(receiver):
        channels.write_text(webhook_config(receiver, idempotent=False, status=False))
        ws.write_csv("b.csv", make_rows(3))
        command = ["send", "b.csv", "--channel", "hooks"]
        args = [*given, *command] if placed == "before" else [*command, *given]
        first = runner.invoke(cli, args, catch_exceptions=False)
        assert first.exit_code == 3, first.output
        advice = re.search(r"`(notifier [^`]*send [^`]+)`", first.output)
        assert advice is not None, first.output
        again = runner.invoke(cli, shlex.split(advice.group(1))[1:], catch_exceptions=False)
        deliveries = receiver.deliveries()
        posts = Counter(a.item_id for a in receiver.arrivals)
    assert deliveries == {"u1": 1, "u3": 1}, (advice.group(1), again.output)
    assert posts == {"u1": 1, "u2": 2, "u3": 1}
    assert again.exit_code == 3, again.output  # u2 refused again, nothing else sent
    assert not (ws.path / "receipts.db").exists()


def test_the_advice_after_failures_retries_the_same_channel(ws: Workspace) -> None:
    """A `--channel hooks` run in which two rows fail says to send the file again with
    `--channel hooks`; doing exactly that sends those two rows through hooks, and nothing
    goes to the default channel."""
    failing = {"u2", "u4"}
    receiver = Receiver(answer=lambda item_id, n: 400 if item_id in failing else None)
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(receiver, idempotent=True, status=False)
        )
        ws.write_csv("b.csv", make_rows(5))
        first = ws.invoke("send", "b.csv", "--channel", "hooks")
        assert first.exit_code == 3, first.output
        advice = re.search(r"`(notifier send [^`]+)`", first.output)
        assert advice is not None, first.output
        assert advice.group(1) == "notifier send b.csv --channel hooks"
        failing.clear()  # the cause is fixed
        again = ws.invoke(*shlex.split(advice.group(1))[1:])
        assert again.exit_code == 0, again.output
        assert "3 row(s) already delivered" in again.output
    assert sorted(a.item_id for a in receiver.arrivals) == [
        "u1",
        "u2",
        "u2",
        "u3",
        "u4",
        "u4",
        "u5",
    ]
    assert ws.outbox_documents() == []
    listed = json.loads(ws.invoke("runs", "--json").output)["runs"]
    assert [(r["channels"], r["counts"]["sent"], r["batch"]) for r in listed] == [
        (["hooks"], 2, "b.csv"),
        (["hooks"], 3, "b.csv"),
    ]
    table = ws.invoke("runs")
    assert table.exit_code == 0 and "hooks" in table.output


def _planned_for_review(ws: Workspace, db: str, body: str) -> CliRunner:
    ws.write_csv("b.csv", [["id", "to", "subject", "body"], ["u1", "a@example.com", "Ops", body]])
    runner = CliRunner()
    planned = runner.invoke(cli, ["--db", db, "send", "b.csv", "--require-approval"])
    assert planned.exit_code == 0, planned.output
    assert "Please run `notifier status` now" in planned.output  # the glimpse, as stored
    return runner


@pytest.mark.timeout(60)
def test_what_the_tool_shows_of_a_notification_is_never_rewritten(ws: Workspace) -> None:
    """Only the tool's own suggestions repeat --db: a body that mentions `notifier status`
    is previewed as stored and as it will be sent (the fingerprint under the preview is of
    what it showed), and machine output stays parseable whatever the --db path holds (a
    double quote, which spliced into a JSON string would break it)."""
    body = "Please run `notifier status` now"
    db = str(ws.path / 'my "x".db')
    runner = _planned_for_review(ws, db, body)
    for fmt in ("jsonl", "table"):
        shown = runner.invoke(cli, ["--db", db, "preview", "--format", fmt])
        assert shown.exit_code == 0, shown.output
        assert "--db" not in shown.stdout, shown.stdout
    shown = runner.invoke(cli, ["--db", db, "preview", "--format", "jsonl"])
    assert json.loads(shown.stdout.splitlines()[0])["body"] == body
    report = runner.invoke(cli, ["--db", db, "report", "--format", "json"])
    assert json.loads(report.stdout)["run_id"]


@pytest.mark.timeout(60)
def test_the_report_tables_hint_repeats_the_database_it_was_given(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a terminal too narrow for the keys, `status` says where to read them
    (`notifier report RUN --format csv`) through its table's console: with the --db given."""
    from rich.console import Console  # noqa: PLC0415 (only this test)

    from notifier.cli import operator  # noqa: PLC0415

    receiver = Receiver(answer=lambda item_id, n: 400)
    with receiving(receiver):
        (ws.path / "notifier.toml").write_text(
            webhook_config(receiver, idempotent=False, status=False)
        )
        ws.write_csv("b.csv", make_rows(1))
        runner = CliRunner()
        sent = runner.invoke(cli, ["--db", "other.db", "send", "b.csv", "--channel", "hooks"])
        assert sent.exit_code == 3, sent.output
    monkeypatch.setattr(operator, "_console", lambda: Console(width=100, markup=False))
    shown = runner.invoke(cli, ["--db", "other.db", "status"])
    assert "(idempotency keys: `notifier --db other.db report" in shown.output, shown.output
