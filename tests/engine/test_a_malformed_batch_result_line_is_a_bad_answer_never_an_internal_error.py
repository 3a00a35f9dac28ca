"""A Message Batches results file is a server's answer: a line that is not JSON, not an
object, without a text custom_id, without a result, or an `errored` result without its
error is a bad answer. The rows it leaves without a draft stay undrafted (a later chunk, or
`resume`, asks again) and the command ends with the contract's exit 3 or 0, saying what it
found, never with an internal error (exit 1)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ..conftest import Workspace
from ..fake_messages import Canned, FakeBatches, serving
from .test_compose import batch, brief

pytestmark = pytest.mark.timeout(60)
Lines = list[Any]


class Mangles(FakeBatches):
    """FakeBatches whose results files are `mangle`d (given the lines, returns the text)."""

    def __init__(self, mangle: Callable[[Lines], str]) -> None:
        super().__init__()
        self.mangle = mangle

    def on_get(self, path: str) -> Canned:
        answer = super().on_get(path)
        if path.endswith("/results") and "jsonl" in answer.body:
            lines = [json.loads(x) for x in answer.body["jsonl"].splitlines()]
            return Canned(200, {"jsonl": self.mangle(lines)})
        return answer


def serve(monkeypatch: pytest.MonkeyPatch, server: FakeBatches) -> Iterator[FakeBatches]:
    with serving(monkeypatch, server):
        yield server


def jsonl(lines: Lines) -> str:
    return "".join(json.dumps(x) + "\n" for x in lines)


def first_as(line: dict[str, Any], lines: Lines) -> str:
    return jsonl([line, *lines[1:]])


CASES: dict[str, Callable[[Lines], str]] = {
    "a-line-not-json": lambda ls: jsonl(ls) + "this is not JSON\n",
    "a-line-not-an-object": lambda ls: jsonl([*ls, [1, 2]]),
    "no-custom-id": lambda ls: jsonl([*ls, {"result": ls[0]["result"]}]),
    "custom-id-a-number": lambda ls: jsonl([*ls, {"custom_id": 5, "result": ls[0]["result"]}]),
    "no-result": lambda ls: first_as({"custom_id": ls[0]["custom_id"]}, ls),
    "errored-without-its-error": lambda ls: first_as(
        {"custom_id": ls[0]["custom_id"], "result": {"type": "errored"}}, ls
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_malformed_results_line_ends_with_the_contracts_exit_code(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    for _ in serve(monkeypatch, Mangles(CASES[case])):
        result = ws.invoke("send", str(batch(ws, 2)), "--compose", str(brief(ws)), "--batch-api")
        assert result.exit_code in (0, 3), result.output
        assert "internal error" not in result.output
