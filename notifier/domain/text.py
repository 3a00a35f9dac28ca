"""What one line of text may hold: no control character. A recipient, a subject, a row's id,
a channel's name, a URL: each is one line, typed at a prompt, listed by `status`, written
into a header or a request line. The C0 and C1 controls, DEL, and the line and paragraph
separators (U+2028, U+2029, which end a line for Python's own e-mail headers) are none of
that: PostgreSQL stores no NUL, an escape acts on the terminal of whoever lists it, and a
line break smuggles a header in."""

from __future__ import annotations

import re

CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def control_character(value: str) -> str | None:
    """The first control character of `value` as its code point (`U+001B`), else None."""
    found = CONTROL.search(value)
    return None if found is None else f"U+{ord(found.group()):04X}"
