"""A --run-id is typed after commands and named in files: 1-64 letters, digits, '.', '_' or
'-', starting with a letter or a digit (one starting with '-' would read as an option). A
refused one is exit 2 saying which rule it breaks, nothing stored."""

from __future__ import annotations

import pytest

from ..conftest import Workspace, make_rows

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    ("run_id", "rule"),
    [
        ("-x", "start with a letter or a digit"),
        (".hidden", "start with a letter or a digit"),
        ("a b", "letters, digits"),
        ("x" * 65, "1-64"),
    ],
    ids=["dash-first", "dot-first", "space", "too-long"],
)
def test_a_refused_run_id_names_the_rule_it_breaks(ws: Workspace, run_id: str, rule: str) -> None:
    batch = ws.write_csv("b.csv", make_rows(1))
    result = ws.invoke("send", str(batch), f"--run-id={run_id}")
    assert result.exit_code == 2, result.output
    assert rule in result.output, result.output
    assert not ws.db_file.exists()
