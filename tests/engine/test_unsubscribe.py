"""One-click unsubscribe (RFC 8058): the optional `unsubscribe_url` (https) and
`unsubscribe_mailto` columns are checked when planning (bad cells and, with
`require_unsubscribe`, missing ones fail the file with their lines, nothing stored), are part
of the digest without changing the digest of any row that lacks them, go out as
List-Unsubscribe / List-Unsubscribe-Post headers, and ride in a webhook body only when
present."""

from __future__ import annotations

import email
import email.policy
from typing import Any

import httpx2
import pytest

from notifier.api import Notifier
from notifier.channels.webhook import WebhookChannel
from notifier.domain.intent import Intent, make_payload

from ..conftest import Workspace
from ..smtp_relay import each_key_once, relay

HEADER = ["id", "to", "subject", "body", "unsubscribe_url", "unsubscribe_mailto"]
URL = "https://example.com/unsubscribe?u={}&list=news"
ONE_CLICK = b"List-Unsubscribe-Post: List-Unsubscribe=One-Click"


def _raw_headers(raw: bytes) -> list[bytes]:
    """The header lines as sent, each folded header joined back onto one line."""
    head = raw.split(b"\r\n\r\n", 1)[0].replace(b"\r\n ", b" ")
    return head.split(b"\r\n")


def test_list_unsubscribe_headers_are_exactly_as_rfc_8058_says(ws: Workspace) -> None:
    """https + mailto: `List-Unsubscribe: <https://…>, <mailto:…>` and the one-click Post
    header; https alone: both headers; mailto alone: List-Unsubscribe only (one-click is for
    https); neither: no header at all. Each header once."""
    with relay(ws) as handler:
        ws.write_csv(
            "batch.csv",
            [
                HEADER,
                ["u1", "a1@example.com", "S", "B", URL.format(1), "unsub@example.com"],
                ["u2", "a2@example.com", "S", "B", URL.format(2), ""],
                ["u3", "a3@example.com", "S", "B", "", "MAILTO:unsub@example.com?subject=stop"],
                ["u4", "a4@example.com", "S", "B", "", ""],
            ],
        )
        result = ws.invoke("send", "batch.csv", "--channel", "mail")
        assert result.exit_code == 0, result.output
        assert each_key_once(ws, handler)
    by_to = {str(m["To"]): raw for m, raw in zip(handler.messages, handler.raw, strict=True)}
    lists = {
        to: [line for line in _raw_headers(raw) if line.startswith(b"List-Unsubscribe")]
        for to, raw in by_to.items()
    }
    url1 = URL.format(1).encode()
    assert lists["a1@example.com"] == [
        b"List-Unsubscribe: <" + url1 + b">, <mailto:unsub@example.com>",
        ONE_CLICK,
    ]
    assert lists["a2@example.com"] == [
        b"List-Unsubscribe: <" + URL.format(2).encode() + b">",
        ONE_CLICK,
    ]
    assert lists["a3@example.com"] == [b"List-Unsubscribe: <mailto:unsub@example.com?subject=stop>"]
    assert lists["a4@example.com"] == []
    parsed = email.message_from_bytes(by_to["a1@example.com"], policy=email.policy.default)
    assert parsed.get_all("List-Unsubscribe-Post") == ["List-Unsubscribe=One-Click"]


def test_a_long_url_folds_between_the_two_uris_not_inside_one(ws: Workspace) -> None:
    """A 900-character URL and a 230-character mailto: the header is folded after the
    comma, so no line passes 998 characters and each URI reads back whole."""
    long_url = "https://example.com/u?token=" + "a" * (900 - 28)
    mailto = "mailto:u@example.com?subject=" + "s" * 200
    with relay(ws) as handler:
        ws.write_csv("batch.csv", [HEADER, ["u1", "a@example.com", "S", "B", long_url, mailto]])
        result = ws.invoke("send", "batch.csv", "--channel", "mail")
        assert result.exit_code == 0, result.output
    [raw] = handler.raw
    assert max(len(line) for line in raw.split(b"\r\n")) <= 998
    parsed = email.message_from_bytes(raw, policy=email.policy.default)
    assert str(parsed["List-Unsubscribe"]) == f"<{long_url}>, <{mailto}>"


def _nothing_stored(ws: Workspace) -> bool:
    return not ws.has_database() or ws.ledger.items() == []


def test_bad_unsubscribe_cells_fail_the_file_with_their_lines(ws: Workspace) -> None:
    """An http:// URL, a URL with a space and a mailto that is no address are refused when
    planning, each on its line, exit 2, nothing stored and nothing sent."""
    with relay(ws) as handler:
        ws.write_csv(
            "batch.csv",
            [
                HEADER,
                ["u1", "a1@example.com", "S", "B", "http://example.com/u", ""],
                ["u2", "a2@example.com", "S", "B", "https://example.com/a b", ""],
                ["u3", "a3@example.com", "S", "B", "", "not an address"],
                ["u4", "a4@example.com", "S", "B", URL.format(4), "ok@example.com"],
            ],
        )
        result = ws.invoke("send", "batch.csv", "--channel", "mail")
        assert result.exit_code == 2, result.output
        assert handler.messages == []
    assert "3 problems; nothing was stored" in result.output
    assert "line 2: `unsubscribe_url` 'http://example.com/u' must be an https://" in result.output
    assert "line 3: `unsubscribe_url`" in result.output and "percent-encode" in result.output
    assert "line 4: `unsubscribe_mailto` 'not an address'" in result.output
    assert "line 5" not in result.output
    assert _nothing_stored(ws)


def test_require_unsubscribe_refuses_a_file_with_a_row_lacking_one(ws: Workspace) -> None:
    """With require_unsubscribe = true, a row with neither column filled (or a file without
    the columns) fails the file, naming each such line; exit 2, nothing stored or sent."""
    with relay(ws, "require_unsubscribe = true\n") as handler:
        ws.write_csv(
            "batch.csv",
            [
                HEADER,
                ["u1", "a1@example.com", "S", "B", URL.format(1), ""],
                ["u2", "a2@example.com", "S", "B", "", ""],
                ["u3", "a3@example.com", "S", "B", "", "u@example.com"],
                ["u4", "a4@example.com", "S", "B", "", ""],
            ],
        )
        result = ws.invoke("send", "batch.csv", "--channel", "mail")
        assert result.exit_code == 2, result.output
        lines = [line for line in result.output.splitlines() if "require_unsubscribe" in line]
        assert [line.split(":")[0].strip() for line in lines] == ["line 3", "line 5"]
        ws.write_csv("plain.csv", [["to", "subject"], ["a@example.com", "Hi"]])
        plain = ws.invoke("send", "plain.csv", "--channel", "mail")
        assert plain.exit_code == 2 and "line 2: no unsubscribe address" in plain.output
        assert handler.messages == []
    assert _nothing_stored(ws)


# ---------------------------------------------------------------------- digests and bodies

# Planned by the code before it (a checkout without the unsubscribe columns), for the
# rows of PINNED: any change to how a row without them digests would show here.
PINNED_ROWS = [
    ["id", "to", "subject", "body", "name"],
    ["u1", "Ann@Example.COM", "Hello Ann", "Body one", "Ann"],
    ["u2", "bob@example.com", "Héllo", "Line 1\nLine 2", "Bob"],
]
PINNED = [
    "sha256:c3470830a7a92e419c25ee0cc9879d14aaf44b87c79cb048c714a73a20825a78",
    "sha256:8ca092c94761e54607895ea86cf3055cb216e48045b130d3d779b47d24f1a2be",
]


def _digests(ws: Workspace) -> list[str]:
    return [item.intent_digest for item in ws.ledger.items()]


def _payloads(ws: Workspace) -> list[dict[str, Any]]:
    """The stored payloads of the run, by seq, as the API reads them."""
    notifier = Notifier.open(ws.db)
    return [item.payload for item in notifier.items(notifier.run().run_id)]


def test_rows_without_unsubscribe_columns_digest_as_they_always_have(ws: Workspace) -> None:
    """The same file planned today stores the very digests the code before the columns
    stored, and its payloads hold no unsubscribe key."""
    ws.write_csv("batch.csv", PINNED_ROWS)
    result = ws.invoke("send", "batch.csv")
    assert result.exit_code == 0, result.output
    assert _digests(ws) == PINNED
    payloads = _payloads(ws)
    assert all(not any(k.startswith("unsubscribe") for k in p) for p in payloads)


def test_the_unsubscribe_addresses_are_part_of_the_digest(ws: Workspace) -> None:
    """Rows equal but for their unsubscribe cells digest apart; empty cells digest as a file
    without the columns (the pinned digest)."""
    rows = [
        [*PINNED_ROWS[0], "unsubscribe_url", "unsubscribe_mailto"],
        ["u1", *PINNED_ROWS[1][1:], "", ""],
        ["u2", *PINNED_ROWS[1][1:], URL.format(1), ""],
        ["u3", *PINNED_ROWS[1][1:], URL.format(2), ""],
        ["u4", *PINNED_ROWS[1][1:], URL.format(2), "u@example.com"],
    ]
    ws.write_csv("batch.csv", rows)
    result = ws.invoke("send", "batch.csv", "--new-run")
    assert result.exit_code == 0, result.output
    digests = _digests(ws)
    assert digests[0] == PINNED[0]
    assert len(set(digests)) == 4
    assert _payloads(ws)[3]["unsubscribe_mailto"] == "mailto:u@example.com"


def _webhook_body(payload: dict[str, Any]) -> bytes:
    seen: list[bytes] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request.content)
        return httpx2.Response(200, json={"id": "r1"})

    intent = Intent("run-1", 1, "u1", "hooks", "ann@example.com", payload, "ntf1-k", "sha256:d")
    channel = WebhookChannel(
        "hooks", {"type": "webhook", "url": "http://hooks.test/n"}, httpx2.MockTransport(handler)
    )
    channel.send(intent)
    channel.close()
    return seen[0]


@pytest.mark.parametrize("present", [False, True])
def test_webhook_body_carries_the_unsubscribe_fields_only_when_present(present: bool) -> None:
    """Without them the body is byte for byte the one before them; with them it adds
    `unsubscribe_url` and `unsubscribe_mailto` after the existing fields."""
    extra = (URL.format(1), "mailto:u@example.com") if present else (None, None)
    body = _webhook_body(make_payload("Hi", "B", {"k": "v"}, None, *extra))
    before = (
        b'{"to":"ann@example.com","subject":"Hi","body":"B","data":{"k":"v"},'
        b'"run_id":"run-1","item_id":"u1"'
    )
    if not present:
        assert body == before + b"}"
    else:
        assert body == (
            before + b',"unsubscribe_url":"' + URL.format(1).encode() + b'",'
            b'"unsubscribe_mailto":"mailto:u@example.com"}'
        )
