"""`--model`, `--batch-api` and `--compose-columns` say how Claude drafts a composed send:
given without `--compose`, the operator believes the rows will be drafted so, and they would
be sent as written. Refused (exit 2) before anything is stored or sent, naming `--compose`."""

from __future__ import annotations

import pytest

from ..conftest import Workspace

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    "given",
    [["--model", "claude-opus-4-1"], ["--batch-api"], ["--compose-columns", "plan"]],
    ids=["model", "batch-api", "compose-columns"],
)
def test_a_drafting_option_without_compose_is_exit_2_and_sends_nothing(
    ws: Workspace, given: list[str]
) -> None:
    ws.write_csv(
        "batch.csv", [["to", "subject", "body", "plan"], ["a@example.com", "Hi", "x", "t"]]
    )
    result = ws.invoke("send", "batch.csv", *given)
    assert result.exit_code == 2, result.output
    assert "--compose" in result.output, result.output
    assert given[0] in result.output, result.output
    assert "Traceback" not in result.output
    assert not ws.db_file.exists()
    assert not (ws.path / "outbox").exists() or not any((ws.path / "outbox").iterdir())


def test_the_default_model_is_no_option_given(ws: Workspace) -> None:
    """Only an option the operator gave is refused: a plain send is untouched by the
    default of --model."""
    ws.write_csv("batch.csv", [["to", "subject", "body"], ["a@example.com", "Hi", "x"]])
    result = ws.invoke("send", "batch.csv")
    assert result.exit_code == 0, result.output
