"""`send --template`: Jinja2 rendered per row while planning, strict about undefined names."""

from __future__ import annotations

from pathlib import Path

from notifier.api import Notifier
from notifier.domain.intent import intent_digest

from ..conftest import Workspace, make_rows

TEMPLATE = 'subject = "Hi {{ name }}"\nbody = "Dear {{ name }}, your code is {{ code }}."\n'


def write_template(ws: Workspace, text: str = TEMPLATE) -> Path:
    path = ws.path / "tpl.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_template_renders_each_row_and_the_digest_covers_the_rendered_text(
    ws: Workspace,
) -> None:
    """Each row is rendered with its columns; the stored payload and digest are the result."""
    batch = ws.write_csv(
        "b.csv",
        [
            ["id", "to", "name", "code"],
            ["a", "a@example.com", "Ann", "1"],
            ["b", "b@example.com", "Bob", "2"],
        ],
    )
    result = ws.invoke("send", str(batch), "--template", str(write_template(ws)))
    assert result.exit_code == 0, result.output
    docs = {d["item_id"]: d for d in ws.outbox_documents()}
    assert docs["a"]["subject"] == "Hi Ann"
    assert docs["b"]["body"] == "Dear Bob, your code is 2."
    notifier = Notifier.open(ws.db)
    for item in notifier.items(notifier.run().run_id):
        assert intent_digest(item.channel, item.target, item.payload) == item.intent_digest
        assert item.payload["subject"].startswith("Hi ")


def test_missing_variable_rejects_the_whole_file_with_line_numbers(ws: Workspace) -> None:
    """A row lacking a variable is that line's problem: exit 2, every bad line named,
    nothing stored."""
    batch = ws.write_csv(
        "b.csv",
        [["to", "name", "code"], ["a@example.com", "Ann", "1"], ["b@example.com", "Bob", ""]],
    )
    tpl = write_template(ws, 'subject = "Hi {{ name }}"\nbody = "{{ code }} {{ city }}"\n')
    result = ws.invoke("send", str(batch), "--template", str(tpl))
    assert result.exit_code == 2, result.output
    assert "line 2" in result.output and "line 3" in result.output
    assert "'city' is undefined" in result.output
    assert not ws.db_file.exists() or ws.ledger.items() == []
    assert ws.outbox_documents() == []


def test_template_syntax_error_is_bad_input(ws: Workspace) -> None:
    """A template that does not compile is refused with exit 2 before anything is stored."""
    batch = ws.write_csv("b.csv", make_rows(1))
    tpl = write_template(ws, 'subject = "Hi {{ name "\nbody = "x"\n')
    result = ws.invoke("send", str(batch), "--template", str(tpl))
    assert result.exit_code == 2, result.output
    assert "syntax error" in result.output and not ws.db_file.exists()


def test_sandbox_refuses_python_internals(ws: Workspace) -> None:
    """The sandbox stops a template from reaching Python internals: that row fails, exit 2."""
    batch = ws.write_csv("b.csv", make_rows(1))
    tpl = write_template(
        ws, 'subject = "x"\nbody = "{{ name.__class__.__mro__[1].__subclasses__() }}"\n'
    )
    result = ws.invoke("send", str(batch), "--template", str(tpl))
    assert result.exit_code == 2, result.output
    assert "line 2" in result.output and not ws.db_file.exists()


def test_without_template_braces_stay_literal(ws: Workspace) -> None:
    """Without --template the CSV text is sent as written: `{{ name }}` is not rendered."""
    batch = ws.write_csv(
        "b.csv", [["to", "subject", "body", "name"], ["a@example.com", "{{ name }}", "{{x}}", "A"]]
    )
    result = ws.invoke("send", str(batch))
    assert result.exit_code == 0, result.output
    [doc] = ws.outbox_documents()
    assert doc["subject"] == "{{ name }}" and doc["body"] == "{{x}}"
