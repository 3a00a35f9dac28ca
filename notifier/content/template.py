"""`send --template FILE`: a TOML file with `subject` and `body`, rendered with Jinja2 for
every row while planning, so the digest covers exactly the rendered text (docs/design.md
section 10).

The environment is sandboxed (a template cannot reach Python internals through attribute
access), deterministic (no `random` filter, no `lipsum()`, and a value whose text would
differ between processes, such as a function printed uncalled, is refused: a row without an
`id` is the same row only by its rendered content), undefined variables raise instead of
rendering as empty strings (a typo must not send "Dear ," to a thousand people), and
autoescaping is off: the output is plain text, not HTML.

Jinja2 is imported inside the functions that use it, so that only a command given a template
pays the start-up time of loading it.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from notifier.content.batch_csv import BatchError, BatchRow, Problem, Problems
from notifier.content.text_rules import text_problems
from notifier.domain.errors import BadInput

if TYPE_CHECKING:
    import jinja2
    from jinja2.sandbox import SandboxedEnvironment


class TemplateError(BadInput):
    """The template file itself cannot be used; nothing was stored."""


@dataclass(frozen=True)
class Template:
    """The template's source text (stored with a run, so a resume renders the same thing)
    and its compiled form."""

    subject_source: str
    body_source: str

    def __post_init__(self) -> None:
        env = _environment()
        object.__setattr__(self, "_subject", env.from_string(self.subject_source))
        object.__setattr__(self, "_body", env.from_string(self.body_source))

    def render(self, context: Mapping[str, Any]) -> tuple[str, str]:
        subject: jinja2.Template = getattr(self, "_subject")  # noqa: B009 (set in __post_init__)
        body: jinja2.Template = getattr(self, "_body")  # noqa: B009
        return subject.render(context), body.render(context)

    def as_options(self) -> dict[str, str]:
        return {"subject": self.subject_source, "body": self.body_source}


# What a `{{ … }}` may print: text, numbers, and lists or mappings of them, whose text is
# the same in every process. Anything else (a function not called, `{{ name.upper }}`, or
# an object) prints with its memory address: a new text at each send.
_PRINTABLE = (str, int, float, type(None))


def _printable(value: Any) -> bool:
    if isinstance(value, _PRINTABLE):
        return True
    if isinstance(value, (list, tuple)):
        return all(_printable(v) for v in value)
    if isinstance(value, dict):
        return all(_printable(k) and _printable(v) for k, v in value.items())
    return False


def _finalize(value: Any) -> Any:
    """Every printed value, checked: the rendering must be the same at every send, since a
    row without an `id` is the same row only by its content (plan.make_plan)."""
    import jinja2  # noqa: PLC0415 (start-up time)

    if isinstance(value, jinja2.Undefined) or _printable(value):
        return value
    raise jinja2.TemplateRuntimeError(
        f"it prints a {type(value).__name__}, not text (a function not called? add the parentheses)"
    )


def _environment() -> SandboxedEnvironment:
    import jinja2  # noqa: PLC0415 (start-up time: see the module docstring)
    from jinja2.sandbox import SandboxedEnvironment  # noqa: PLC0415

    env = SandboxedEnvironment(
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # plain-text notifications, not HTML
        keep_trailing_newline=True,
        finalize=_finalize,
    )
    # A row is rendered the same at every send (its content is its identity without an
    # `id`): nothing random. A template using them is refused (exit 2, nothing stored).
    del env.filters["random"]
    del env.globals["lipsum"]
    return env


def from_sources(subject: str, body: str, where: str) -> Template:
    import jinja2  # noqa: PLC0415 (start-up time)

    try:
        return Template(subject, body)
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(
            f"{where}: template syntax error on line {exc.lineno}: {exc.message}. Fix the "
            "template and run the command again; nothing was stored."
        ) from exc


def load(path: Path) -> Template:
    """Read and compile `path`; a missing key or a syntax error is a TemplateError."""
    try:
        data = tomllib.loads(path.read_text("utf-8"))
    except OSError as exc:
        raise TemplateError(f"{path}: cannot read the template ({exc.strerror}).") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise TemplateError(f"{path}: not valid UTF-8 TOML ({exc}).") from exc
    missing = [k for k in ("subject", "body") if not isinstance(data.get(k), str)]
    if missing:
        raise TemplateError(
            f"{path}: the template needs string keys `subject` and `body`; missing or not "
            f'text: {", ".join(missing)}. Example: subject = "Hello {{{{ name }}}}".'
        )
    return from_sources(data["subject"], data["body"], str(path))


def context(row: BatchRow, draft: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The variables a template sees: the row's data columns, its own columns, and with
    --compose the draft as `draft.subject` / `draft.body`."""
    values: dict[str, Any] = dict(row.data)
    values.update(
        to=row.to, id=row.item_id, subject=row.subject, body=row.body, channel=row.channel
    )
    if draft is not None:
        values["draft"] = dict(draft)
    return values


def render_row(
    template: Template, row: BatchRow, draft: Mapping[str, str] | None = None
) -> BatchRow | Problem:
    """The row with its subject and body replaced by the rendered text, or the problem of
    that line."""
    import jinja2  # noqa: PLC0415 (start-up time)

    try:
        subject, body = template.render(context(row, draft))
    except jinja2.UndefinedError as exc:
        return Problem(row.line, f"template: {exc.message}: add the column or fix the template")
    except jinja2.TemplateError as exc:
        return Problem(row.line, f"template failed to render: {exc}")
    except Exception as exc:  # a filter given a value it cannot take, e.g. int("x")
        return Problem(row.line, f"template failed to render: {type(exc).__name__}: {exc}")
    problems = text_problems(subject, body)
    if problems:
        return Problem(row.line, "; ".join(f"rendered: {p}" for p in problems))
    return row._replace(subject=subject, body=body)


def render_rows(
    template: Template,
    rows: list[BatchRow],
    path: Path,
    drafts: Mapping[int, Mapping[str, str]] | None = None,
) -> list[BatchRow]:
    """Every row rendered, or a BatchError listing every line that failed (nothing stored)."""
    rendered: list[BatchRow] = []
    problems: list[Problem] = []
    for row in rows:
        result = render_row(template, row, drafts.get(row.seq) if drafts is not None else None)
        if isinstance(result, Problem):
            problems.append(result)
        else:
            rendered.append(result)
    if problems:
        raise BatchError(path, problems)
    return rendered


def render_stream(
    template: Template, rows: Iterable[BatchRow], problems: Problems
) -> Iterator[BatchRow]:
    """Each row rendered as it streams past; a row that fails is noted in `problems` (with
    its line) and left out, and the caller raises BatchError once the stream is done."""
    for row in rows:
        result = render_row(template, row)
        if isinstance(result, Problem):
            problems.append(result)
        else:
            yield result
