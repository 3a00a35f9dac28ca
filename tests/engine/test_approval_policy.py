"""Approval as a policy, not a per-command switch: `notifier.toml` can require it for every
run or for the runs of some channels, and the rows of a rejected run need it again whenever
they are planned again, whatever the flags. Through the real CLI, on both stores."""

from __future__ import annotations

import re

import pytest

from ..conftest import Workspace, make_rows

pytestmark = pytest.mark.both_stores


def _run_states(ws: Workspace) -> list[str]:
    return [run.state for run in ws.ledger.runs()]


@pytest.mark.parametrize(
    "policy",
    [
        "[approval]\nrequired = true\n",
        "[channels.mail]\ntype = 'outbox'\n[channels.mail.approval]\nrequired = true\n",
        "[channels.mail]\ntype = 'outbox'\nrequired = true\n",
    ],
    ids=["for-all", "channel-table", "channel-key"],
)
def test_a_plain_send_waits_for_approval_when_the_config_requires_it(
    ws: Workspace, policy: str
) -> None:
    """With the policy on, `send` without --require-approval stores the plan, sends
    nothing and prints how to approve; approving and resuming then sends it."""
    (ws.path / "notifier.toml").write_text(policy)
    ws.write_csv("b.csv", make_rows(3))
    result = ws.invoke("send", "b.csv", "--channel", "mail" if "mail" in policy else "outbox")
    assert result.exit_code == 0, result.output
    assert "awaiting approval; nothing was sent" in result.output
    assert _run_states(ws) == ["awaiting_approval"]
    assert ws.outbox_documents() == []
    fingerprint = re.search(r"fingerprint: (sha256:[0-9a-f]+)", result.output)
    assert fingerprint is not None
    assert ws.invoke("approve", "--fingerprint", fingerprint.group(1)).exit_code == 0
    resumed = ws.invoke("resume")
    assert resumed.exit_code == 0, resumed.output
    assert len(ws.outbox_documents()) == 3


def test_a_channel_policy_leaves_other_channels_alone(ws: Workspace) -> None:
    """Only runs through a channel that requires approval wait for it."""
    (ws.path / "notifier.toml").write_text(
        "[channels.mail]\ntype = 'outbox'\n[channels.mail.approval]\nrequired = true\n"
    )
    ws.write_csv("b.csv", make_rows(2))
    sent = ws.invoke("send", "b.csv")  # the default channel, outbox
    assert sent.exit_code == 0, sent.output
    assert _run_states(ws) == ["completed"]
    assert len(ws.outbox_documents()) == 2


def test_a_misspelled_approval_setting_is_refused(ws: Workspace) -> None:
    """A typo in the policy must not silently turn it off: exit 2, naming the fix."""
    (ws.path / "notifier.toml").write_text("[approval]\nrequird = true\n")
    ws.write_csv("b.csv", make_rows(1))
    refused = ws.invoke("send", "b.csv")
    assert refused.exit_code == 2, refused.output
    assert "[approval] unknown setting `requird`" in refused.output
    assert "required" in refused.output
    assert "Fix the file" in refused.output


@pytest.mark.parametrize("flags", [(), ("--new-run",)], ids=["plain", "new-run"])
def test_the_rows_of_a_rejected_run_need_approval_again(
    ws: Workspace, flags: tuple[str, ...]
) -> None:
    """A batch planned with --require-approval and rejected is not sent by a plain `send`
    of the same file (nor with --new-run): the new run waits for approval, and the summary
    names the rejected run."""
    ws.write_csv("c.csv", make_rows(3))
    planned = ws.invoke("send", "c.csv", "--require-approval")
    assert planned.exit_code == 0, planned.output
    (rejected_run,) = [r.run_id for r in ws.ledger.runs()]
    rejected = ws.invoke("reject", "--reason", "not this week")
    assert rejected.exit_code == 0, rejected.output
    again = ws.invoke("send", "c.csv", *flags)
    assert again.exit_code == 0, again.output
    assert f"3 row(s) were rejected in run {rejected_run}" in again.output
    assert "awaiting approval; nothing was sent" in again.output
    assert _run_states(ws) == ["cancelled", "awaiting_approval"]
    assert ws.outbox_documents() == []


def test_the_rows_of_a_rejected_run_need_approval_again_when_composed(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`send --compose` of a rejected batch's rows waits for approval too, whatever the
    flags: drafted, never sent before it is approved."""
    from ..fake_messages import FakeMessages  # noqa: PLC0415 (only this test drafts)

    ws.write_csv("c.csv", make_rows(2))
    assert ws.invoke("send", "c.csv", "--require-approval").exit_code == 0
    assert ws.invoke("reject", "--reason", "not this week").exit_code == 0
    (ws.path / "brief.txt").write_text("Say hello.")
    server = FakeMessages()
    with server.running():
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-0123456789")
        composed = ws.invoke("send", "c.csv", "--compose", "brief.txt")
    assert composed.exit_code == 0, composed.output
    assert "were rejected in run" in composed.output
    assert _run_states(ws) == ["cancelled", "awaiting_approval"]
    assert ws.outbox_documents() == []
