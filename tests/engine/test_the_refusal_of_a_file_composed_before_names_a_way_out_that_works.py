"""A file composed and delivered with an `id` column, then sent plain with that column dropped
and a new row, is refused (same_content); the refusal's advice must work: the way out it
names must be the one that works. Sent plain with its `id` column, the row is refused again
as changed (its delivered text was drafted); composed with its `id` column, as it was, the
delivered row is left out and the new row alone is sent: so the refusal must name
`--compose` when the rows it matched were composed. On both stores, through the CLI against the fake
Messages API."""

from __future__ import annotations

import pytest

from ..conftest import Workspace, make_rows
from ..fake_messages import FakeMessages
from .test_compose import brief

pytestmark = [pytest.mark.both_stores, pytest.mark.timeout(90)]


def test_a_composed_file_sent_plain_without_its_ids_is_refused_with_advice_that_works(
    ws: Workspace, fake: FakeMessages
) -> None:
    rows = make_rows(2)
    composed = ws.invoke("send", str(ws.write_csv("c.csv", rows[:2])), "--compose", str(brief(ws)))
    assert composed.exit_code == 0, composed.output
    refused = ws.invoke("send", str(ws.write_csv("c.csv", [r[1:] for r in rows])))
    assert refused.exit_code == 2, refused.output
    plain = ws.invoke("send", str(ws.write_csv("c.csv", rows)))
    assert plain.exit_code == 2, plain.output  # the plain file with ids: changed
    again = ws.invoke("send", str(ws.write_csv("c.csv", rows)), "--compose", str(brief(ws)))
    assert again.exit_code == 0, again.output
    assert len(ws.outbox_documents()) == 2
    assert "--compose" in refused.output, refused.output
