"""intent.row_digest, what identifies a row without an `id`: its intent digest with its
deadline left out and its line breaks written `\\n`, and nothing else left out. Planning
takes a row's intent digest as its row digest when the row has neither (content/plan.py):
the two are equal there."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from notifier.domain.intent import (
    digest_of_normalised,
    payload_json,
    row_digest,
    stored_row_digest,
)

TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=40)
DATA = st.dictionaries(st.from_regex(r"[a-z]{1,6}", fullmatch=True), TEXT, max_size=3)


def _intent(subject: str, body: str, data: dict[str, str], not_after: str | None = None) -> str:
    payload = payload_json(subject, body, data, not_after)
    return digest_of_normalised("hooks", "a@example.com", payload)


@given(TEXT, TEXT, DATA)
def test_without_a_deadline_or_a_cr_it_is_the_intent_digest(
    subject: str, body: str, data: dict[str, str]
) -> None:
    subject, body = subject.replace("\r", ""), body.replace("\r", "")
    data = {k: v.replace("\r", "") for k, v in data.items()}
    assert row_digest("hooks", "a@example.com", subject, body, data) == _intent(subject, body, data)


@given(TEXT, TEXT, DATA, st.sampled_from(["\r\n", "\r"]))
def test_a_line_break_written_otherwise_is_the_same_row(
    subject: str, body: str, data: dict[str, str], breaks: str
) -> None:
    subject, body = subject.replace("\r", ""), body.replace("\r", "")
    lf = row_digest("hooks", "a@example.com", subject + "\n", body + "\nx", data)
    other = row_digest("hooks", "a@example.com", subject + breaks, body + breaks + "x", data)
    assert lf == other


def test_the_deadline_is_left_out_and_nothing_else() -> None:
    stored = payload_json("Hi", "Body", {"name": "Ann"}, "2099-01-01T00:00:00.000000+00:00")
    without = row_digest("hooks", "a@example.com", "Hi", "Body", {"name": "Ann"})
    assert stored_row_digest("hooks", "a@example.com", stored) == without
    assert without == _intent("Hi", "Body", {"name": "Ann"})
    for changed in (
        row_digest("hooks", "a@example.com", "Hi", "Body.", {"name": "Ann"}),
        row_digest("hooks", "a@example.com", "Hi", "Body", {"name": "Bob"}),
        row_digest("hooks", "b@example.com", "Hi", "Body", {"name": "Ann"}),
        row_digest("files", "a@example.com", "Hi", "Body", {"name": "Ann"}),
        row_digest("hooks", "a@example.com", "Hi", "Body", {"name": "Ann"}, "https://x.example/u"),
        row_digest("hooks", "a@example.com", "Hi", "Bo\ndy", {"name": "Ann"}),
    ):
        assert changed != without
