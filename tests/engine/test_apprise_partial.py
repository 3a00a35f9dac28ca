"""An Apprise channel with several URLs where some fail. Marking such an item
`not-sent` would send it again to the URLs that already got it, so it is refused."""

from __future__ import annotations

import pytest

from notifier.sandbox.server import Faults, Sandbox

from ..conftest import Workspace, make_rows
from ..support.net import refusing_port

pytest.importorskip("apprise")


def test_mark_not_sent_is_refused_for_a_partial_delivery(ws: Workspace) -> None:
    """One URL delivers, one is refused: the item is unknown as a partial delivery,
    `reconcile --mark not-sent` exits 4 naming the fix, and `resume` sends nothing again."""
    with Sandbox(faults=Faults(idempotent=False)) as sandbox, refusing_port() as dead:
        port = sandbox.url.rsplit(":", 1)[1]
        (ws.path / "notifier.toml").write_text(
            "[channels.alerts]\n"
            'type = "apprise"\n'
            f'urls = ["json://127.0.0.1:{port}/notifications", '
            f'"json://127.0.0.1:{dead}/notifications"]\n'
            "timeout = 2\n"
        )
        ws.write_csv("batch.csv", make_rows(1))
        sent = ws.invoke("send", "batch.csv", "--channel", "alerts")
        assert sent.exit_code == 3, sent.output
        marked = ws.invoke(
            "reconcile", "--manual", "--item", "u1", "--mark", "not-sent",
            "--evidence", "the dead URL never got it",
        )  # fmt: skip
        resumed = ws.invoke("resume")
        deliveries = sandbox.deliveries()
    assert len(deliveries) == 1, deliveries
    assert marked.exit_code == 4, marked.output
    assert "--mark sent" in marked.output and "abandon" in marked.output
    assert [i.state for i in ws.ledger.items()] == ["unknown"]
    assert [a.outcome for a in ws.ledger.attempts()] == ["partial"]
    assert resumed.exit_code == 3, resumed.output


def test_partial_delivery_can_still_be_marked_sent_with_evidence(ws: Workspace) -> None:
    """The refusal names a way out that works: `--mark sent` with evidence settles it."""
    with Sandbox(faults=Faults(idempotent=False)) as sandbox, refusing_port() as dead:
        port = sandbox.url.rsplit(":", 1)[1]
        (ws.path / "notifier.toml").write_text(
            "[channels.alerts]\n"
            'type = "apprise"\n'
            f'urls = ["json://127.0.0.1:{port}/notifications", '
            f'"json://127.0.0.1:{dead}/notifications"]\n'
        )
        ws.write_csv("batch.csv", make_rows(1))
        assert ws.invoke("send", "batch.csv", "--channel", "alerts").exit_code == 3
        marked = ws.invoke(
            "reconcile", "--manual", "--item", "u1", "--mark", "sent",
            "--evidence", "first URL delivered; second one's team told by phone",
        )  # fmt: skip
        assert len(sandbox.deliveries()) == 1
    assert marked.exit_code == 0, marked.output
    assert [i.state for i in ws.ledger.items()] == ["sent"]
