"""Why a run stopped, and by whose decision (runs.stop_reason and stop_cause: what `status`
and `report` print as "stopped because"), is what the run's events say: a rejection given
another reviewer or reason, or a cancel passed off as a reviewer's rejection, is named by
`verify`, in the database and in an export taken after the edit. The one stop reason a
command rewrites without an event, a pause's count of items of unknown outcome (brought up
to date, or cleared, as a reconcile settles them), is never called altered. Both stores,
under the audit key."""

from __future__ import annotations

from pathlib import Path

import pytest

from notifier.api import Notifier
from notifier.channels.scripted import DELIVER, LOST_AFTER_COMMIT, Response
from notifier.domain.intent import Intent
from notifier.domain.verify import AuditVerdict

from ..conftest import Workspace, make_rows
from ..support.audited import TOML, config, keyed, named, send, verdict

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(120)]
RUN = "reviewed"


def plan_for_approval(ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    keyed(monkeypatch)
    (ws.path / "notifier.toml").write_text(TOML)
    ws.write_csv("batch.csv", make_rows(3))
    planned = ws.invoke("send", "batch.csv", "--channel", "hooks", "--run-id", RUN,
                        "--require-approval")  # fmt: skip
    assert planned.exit_code == 0, planned.output


@pytest.fixture
def rejected(ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> Workspace:
    """A run its reviewer, carol, rejected: verified whole before any test changes it."""
    plan_for_approval(ws, monkeypatch)
    result = ws.invoke("reject", RUN, "--reason", "wrong audience", env={"USER": "carol"})
    assert result.exit_code == 0, result.output
    assert ws.query("SELECT stop_reason FROM runs WHERE run_id = ?", (RUN,)) == [
        ("rejected by carol: wrong audience",)
    ]
    whole = verdict(ws, RUN)
    assert (whole.verdict, whole.findings) == (AuditVerdict.KEYED, ())
    return ws


def test_a_rejection_given_another_reviewer_is_named(rejected: Workspace) -> None:
    rejected.write("UPDATE runs SET stop_reason = 'rejected by mallory: spam' WHERE run_id = ?",
                   (RUN,))  # fmt: skip
    assert "rejected by mallory" in rejected.invoke("status", RUN).output
    found = verdict(rejected, RUN)
    assert found.verdict is AuditVerdict.ALTERED
    assert named(found) == {("runs", "the run", "differs", "stop_reason")}
    (difference,) = found.findings
    assert difference.stored == "rejected by mallory: spam"
    assert difference.expected == "rejected by carol: wrong audience"
    shown = rejected.invoke("verify", RUN)
    assert shown.exit_code == 5, shown.output
    assert "stop_reason" in shown.output


def test_a_rejection_rewritten_before_an_export_is_named_in_the_file(rejected: Workspace) -> None:
    """The file is whole by its seals (the edit was made before it was sealed), but the
    reason it holds is not the one the rejection chained."""
    rejected.write("UPDATE runs SET stop_reason = 'rejected by mallory: spam' WHERE run_id = ?",
                   (RUN,))  # fmt: skip
    to = rejected.path / "audit.db"
    Notifier.open(rejected.db, config=config()).export(RUN, to, with_bodies=False)
    result = Notifier.open(Path(rejected.path / "elsewhere.db"), config=config()).verify_export(to)
    assert result.findings == ()
    ((run,),) = ((v for v in result.runs),)
    assert run.verdict is AuditVerdict.ALTERED
    assert named(run) == {("runs", "the run", "differs", "stop_reason")}


def test_a_cancel_passed_off_as_a_reviewers_rejection_is_named(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan_for_approval(ws, monkeypatch)
    cancelled = ws.invoke("cancel", RUN)  # its items left pending: exit 3
    assert cancelled.exit_code == 3, cancelled.output
    whole = verdict(ws, RUN)
    assert (whole.verdict, whole.findings) == (AuditVerdict.KEYED, ())
    ws.write("UPDATE runs SET stop_reason = 'rejected by carol: wrong audience', "
             "stop_cause = 'rejected' WHERE run_id = ?", (RUN,))  # fmt: skip
    found = verdict(ws, RUN)
    assert found.verdict is AuditVerdict.ALTERED
    assert named(found) == {
        ("runs", "the run", "differs", "stop_reason"),
        ("runs", "the run", "differs", "stop_cause"),
    }


def lose_2_and_5(intent: Intent, tries: int) -> Response:
    return LOST_AFTER_COMMIT if intent.seq in (2, 5) else DELIVER


def test_a_pauses_count_of_unknown_items_brought_up_to_date_by_reconcile_holds(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Paused for 2 items of unknown outcome; one marked sent (the reason now counts 1, no
    event says so), then the other abandoned (the reason cleared): keyed throughout."""
    keyed(monkeypatch)
    send(ws, "paused", 6, lose_2_and_5)
    (ws.path / "notifier.toml").write_text(TOML)

    def stop() -> tuple[object, object]:
        ((reason, cause),) = ws.query(
            "SELECT stop_reason, stop_cause FROM runs WHERE run_id = 'paused'"
        )
        return reason, cause

    assert stop() == ("2 item(s) with unknown outcome", "unknown_left")
    marks = (("u5", "sent", "1 item(s) with unknown outcome"), ("u2", "abandon", None))
    for item, mark, left in marks:
        marked = ws.invoke("reconcile", "paused", "--manual", "--item", item, "--mark", mark,
                           "--evidence", "relay log", env={"USER": "carol"})  # fmt: skip
        assert marked.exit_code in (0, 3), marked.output
        assert stop()[0] == left
        found = verdict(ws, "paused")
        assert (found.verdict, found.findings) == (AuditVerdict.KEYED, ())


def test_a_pauses_count_of_unknown_items_raised_is_named(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reconcile only ever lowers the count (it settles unknown items; a resume that
    leaves more pauses again, with an event): a count above the one the pause chained was
    written by nothing of notifier's."""
    keyed(monkeypatch)
    send(ws, "paused", 6, lose_2_and_5)
    ws.write("UPDATE runs SET stop_reason = '5 item(s) with unknown outcome' "
             "WHERE run_id = 'paused'")  # fmt: skip
    found = verdict(ws, "paused")
    assert found.verdict is AuditVerdict.ALTERED
    assert named(found) == {("runs", "the run", "differs", "stop_reason")}
