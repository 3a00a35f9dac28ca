"""The rules every notification's text is held to, whatever wrote it: the CSV's own
`subject` and `body`, a template's rendering, or a Claude draft. One set, checked at plan
time (batch_csv.py, template.py, compose.py), so what an approver previews is what is sent.

- A recipient or subject carries no line break or other control character: one could
  smuggle extra headers into an e-mail or a webhook log line. Unicode's count: the C1
  controls (U+0080-U+009F, NEL among them) and the line and paragraph separators (U+2028,
  U+2029), which end a line for Python's own e-mail headers (`str.splitlines`).
- A body carries no control character but tab, newline and carriage return: a NUL or an
  ESC would travel raw in a 7-bit message, and a terminal would act on it, not show it
  (as it does on CSI, U+009B, the one-character form of ESC [).
- A subject fits one RFC 5322 line (998 characters); a body, the longest CSV field.
- Neither holds a lone UTF-16 surrogate (U+D800-U+DFFF), which is no character: JSON can
  spell one (a Claude answer's `"\\ud800"`), and no store, log or terminal can encode it."""

from __future__ import annotations

import re

from notifier.domain.text import CONTROL

# The longest field accepted, in characters. The csv module's default (131072) rejects an
# ordinary long HTML body; a few MiB still stops a runaway unclosed quote from swallowing the
# rest of a large file as one field.
MAX_FIELD_CHARS = 4 * 1024 * 1024
MAX_SUBJECT_CHARS = 998
MAX_BODY_CHARS = MAX_FIELD_CHARS
BODY_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
SURROGATE = re.compile(r"[\ud800-\udfff]")
# The line breaks a drafted subject is folded at (compose.check_draft_text): ASCII's and
# Unicode's (NEL, the line and paragraph separators), with the spaces around them.
LINE_BREAKS = re.compile(r"[ \t\r\n\x85\u2028\u2029]+")


def first(pattern: re.Pattern[str], text: str) -> str:
    """The first character of `text` that `pattern` matches, as U+XXXX."""
    found = pattern.search(text)
    return f"U+{ord(found.group()):04X}" if found else "?"


def text_problems(subject: str, body: str) -> list[str]:
    """What breaks the rules in `subject` and `body`, each as the end of a sentence that
    names the field ("the subject …"): empty when all holds."""
    problems = []
    if CONTROL.search(subject):
        problems.append(
            f"the subject contains a control character ({first(CONTROL, subject)}): keep it "
            "on one line, without line breaks"
        )
    if len(subject) > MAX_SUBJECT_CHARS:
        problems.append(f"the subject is {len(subject)} characters, over {MAX_SUBJECT_CHARS}")
    if BODY_CONTROL.search(body):
        problems.append(
            f"the body contains a control character ({first(BODY_CONTROL, body)}); only tab "
            "and line breaks are allowed"
        )
    if len(body) > MAX_BODY_CHARS:
        problems.append(f"the body is {len(body)} characters, over {MAX_BODY_CHARS}")
    for name, text in (("subject", subject), ("body", body)):
        if SURROGATE.search(text):
            problems.append(
                f"the {name} contains {first(SURROGATE, text)}, a lone surrogate that is no "
                "character"
            )
    return problems
