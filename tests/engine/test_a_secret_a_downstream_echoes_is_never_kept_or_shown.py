"""A secret a downstream quotes back in its error (a webhook receiver naming the signing
secret it expected, the Messages API naming the key it refused) is masked before the error
is stored, printed or reported: it reaches neither the database nor any output. Also in the
spellings an echo uses: inside a JSON string whose encoder escapes `/` (PHP's default), and
percent-encoded."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from urllib.parse import quote

import pytest

from ..conftest import Workspace, make_rows
from ..fake_messages import FakeMessages, error
from ..support.answering import answering
from .test_compose import batch, brief

pytestmark = pytest.mark.timeout(60)
# A base64 key with a '/' and a '+': the characters an echo's encoding spells otherwise.
SECRET = "whsec_MfKQ9r8G/YqrTwj+PD8ILPZIo2LaLaSw"
# What of the key must never show: its head, before the first character spelt otherwise.
KEY_HEAD = "MfKQ9r8G"
SPELLINGS: dict[str, Callable[[str], str]] = {
    "as-is": lambda text: text,
    "json-escaped": lambda text: json.dumps(text).replace("/", "\\/"),
    "percent-encoded": lambda text: quote(text, safe=" "),
}


@pytest.fixture(
    params=[(0, "as-is"), (180, "as-is"), (0, "json-escaped"), (0, "percent-encoded")],
    ids=["whole", "across-the-cut", "json-escaped", "percent-encoded"],
)
def echoing_receiver(request: pytest.FixtureRequest) -> Iterator[int]:
    """A webhook receiver that refuses every request (401), quoting the secret it expected:
    at the start of its answer, or across the 200th character, where a stored error's
    extract ends (masked after the cut, its first part would be kept), or spelt as its
    encoder spells it. Its port."""
    padding_n, spelling = request.param
    padding = "x" * padding_n
    spelt = SPELLINGS[spelling]

    with answering(401, lambda _: spelt(f"{padding}{SECRET} is the secret we expected")) as port:
        yield port


def test_a_webhook_secret_quoted_in_a_refusal_is_masked(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch, echoing_receiver: int
) -> None:
    monkeypatch.setenv("HOOKS_SECRET", SECRET)
    (ws.path / "notifier.toml").write_text(
        '[channels.hooks]\ntype = "webhook"\n'
        f'url = "http://127.0.0.1:{echoing_receiver}/n"\n'
        'idempotent = true\ntimeout = 5\nsecret_env = "HOOKS_SECRET"\n'
    )
    ws.write_csv("batch.csv", make_rows(1))
    sent = ws.invoke("send", "batch.csv", "--channel", "hooks")
    assert sent.exit_code == 3, sent.output
    assert "HTTP 401" in sent.output and "***" in sent.output  # the answer, masked
    outputs = [sent.output, ws.invoke("report", "--format", "json").output,
               ws.invoke("status", "--json").output]  # fmt: skip
    assert [text for text in outputs if KEY_HEAD in text] == []
    assert KEY_HEAD.encode() not in ws.stored_bytes()


def test_the_api_key_quoted_in_a_refusal_is_masked(ws: Workspace, fake: FakeMessages) -> None:
    key = os.environ["ANTHROPIC_API_KEY"]
    fake.script.extend(
        error(401, "authentication_error", f"invalid x-api-key: {key}") for _ in range(4)
    )
    sent = ws.invoke("send", str(batch(ws, 2)), "--compose", str(brief(ws)))
    assert sent.exit_code == 3, sent.output
    assert "invalid x-api-key: ***" in sent.output
    outputs = [sent.output, ws.invoke("status", "--json").output]
    assert [text for text in outputs if key in text] == []
    assert key.encode() not in ws.stored_bytes()
