"""A row without an `id` is the same row by its channel, recipient and content, and a
`--template` row's content is its rendering: a template that renders one row differently
from one send to the next (Jinja2's `random` filter, `lipsum()`, or a function printed by
mistake, `{{ name.upper }}`, whose text carries a memory address) makes a delivered row a
new row, so the same file with the same template is sent to everyone again. Such a template
is refused (exit 2, nothing stored), or renders the same each time: never a second delivery."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from ..conftest import Workspace

pytestmark = pytest.mark.timeout(60)
ROWS = 20


def template(ws: Workspace, subject: str) -> Path:
    path = ws.path / "tpl.toml"
    path.write_text(f"subject = {subject!r}\nbody = 'Dear {{{{ name }}}}.'\n", "utf-8")
    return path


@pytest.mark.parametrize(
    "subject",
    [
        "{{ ['Hi', 'Hello', 'Hey', 'Greetings', 'Howdy', 'Yo', 'Dear', 'Ahoy'] | random }}",
        "Hi {{ lipsum(1, html=False, min=5, max=20) }}",
        "Hi {{ name.upper }}",
    ],
)
def test_the_same_file_sent_again_with_the_same_template_delivers_no_row_twice(
    ws: Workspace, subject: str
) -> None:
    rows = [["to", "name"]] + [[f"user{i}@example.com", f"User {i}"] for i in range(ROWS)]
    batch = ws.write_csv("b.csv", rows)
    tpl = template(ws, subject)
    first = ws.invoke("send", str(batch), "--template", str(tpl))
    again = ws.invoke("send", str(batch), "--template", str(tpl))
    assert {first.exit_code, again.exit_code} <= {0, 2}, first.output + again.output
    delivered = Counter(d["to"] for d in ws.outbox_documents())
    assert [to for to, n in delivered.items() if n > 1] == [], again.output
