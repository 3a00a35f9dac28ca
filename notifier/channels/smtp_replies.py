"""What an SMTP relay's answer means for one message: the table of docs/guarantees.md
("SMTP relay answers"), in one place, so every step of a session classifies alike.

- 421, 450, 451, 452 (whatever enhanced code follows, 4.x.x): the relay asks to slow down or
  to try later. THROTTLED: nothing was accepted, and the whole channel waits (its gate
  closes with a backoff, as for an HTTP 429), rather than the item failing.
- any other 4xx: NOT_SENT, a temporary refusal of this message; retried with backoff.
- 5xx: PERMANENT. At RCPT, 550/551/553 with an enhanced code 5.1.x about the destination
  address (RFC 3463: bad mailbox, bad system, bad syntax, moved...) rejects that recipient
  for good: the error names the recipient so that it can be suppressed.
- anything else before the message data: NOT_SENT (nothing was accepted); after it: see
  smtp.py, where a lost or nonsensical final answer is UNCERTAIN.
"""

from __future__ import annotations

import re

from notifier.domain.answers import ErrorKind

# RFC 5321 4.2.2/4.2.3: service closing (421), mailbox busy or greylisted (450), local error
# or rate limit (451), insufficient storage or too many recipients (452).
SLOW_DOWN = frozenset({421, 450, 451, 452})
# RCPT replies that may reject the recipient itself (mailbox unavailable, user not local,
# mailbox name not allowed), when the enhanced code says it is about the address.
RECIPIENT_REJECTED = frozenset({550, 551, 553})
# X.1.7 and X.1.8 are about the sender's address, not the recipient's (RFC 3463 3.2).
_SENDER_DETAILS = frozenset({7, 8})
_ENHANCED = re.compile(r"^([245])\.(\d{1,3})\.(\d{1,3})(?![\d.])")


def enhanced_code(text: str) -> tuple[int, int, int] | None:
    """The RFC 3463 enhanced status code at the start of a reply's text ("5.1.1 No such
    user" -> (5, 1, 1)), or None when the relay gave none."""
    match = _ENHANCED.match(text.strip())
    if match is None:
        return None
    klass, subject, detail = (int(part) for part in match.groups())
    return klass, subject, detail


def kind_of(code: int) -> ErrorKind:
    """What a refusal before the message was accepted means: never UNCERTAIN, since a
    reply to MAIL, RCPT, DATA or the final dot says the relay did not take the message."""
    if code in SLOW_DOWN:
        return ErrorKind.THROTTLED
    if 500 <= code < 600:
        return ErrorKind.PERMANENT
    return ErrorKind.NOT_SENT  # other 4xx, and nonsense (no 2xx/3xx means accepted)


def rejects_recipient(code: int, text: str) -> bool:
    """A RCPT reply that rejects this recipient for good: 550, 551 or 553 with an enhanced
    code 5.1.x about the destination address. A bare 550 (no enhanced code) is left out:
    relays also answer it for policy reasons (relaying denied, spam), which say nothing
    about the address."""
    if code not in RECIPIENT_REJECTED:
        return False
    status = enhanced_code(text)
    return (
        status is not None
        and status[0] == 5
        and status[1] == 1
        and status[2] not in _SENDER_DETAILS
    )


def what(kind: ErrorKind) -> str:
    """How an error message says what the relay did."""
    if kind is ErrorKind.THROTTLED:
        return "asked to slow down (try later) at"
    if kind is ErrorKind.PERMANENT:
        return "refused"
    return "temporarily refused"


def consequence(kind: ErrorKind) -> str:
    """What becomes of the message, for the end of an error message."""
    if kind is ErrorKind.THROTTLED:
        return (
            "nothing was accepted; the channel pauses (backoff) and the message is sent again later"
        )
    if kind is ErrorKind.PERMANENT:
        return "nothing was accepted and sending it again would be refused the same way"
    return "nothing was accepted; the message is sent again after a backoff"
