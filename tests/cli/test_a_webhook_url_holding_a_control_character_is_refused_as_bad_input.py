"""A webhook `url` or `status_url` holding a control character (a NUL or an escape written
as `\\u0000` in notifier.toml, a line break left in the environment variable `url_env`
names) is no URL any request can go to: httpx refuses it at every attempt and PostgreSQL
cannot even store the error that quotes it. It is bad input like any other unusable URL:
exit 2 when the configuration loads, naming the setting, nothing stored and nothing sent,
never a run planned whose items then sit `in_flight` or `unknown`."""

from __future__ import annotations

import pytest

from ..conftest import Workspace

pytestmark = [pytest.mark.timeout(30), pytest.mark.both_stores]


@pytest.mark.parametrize(
    ("key", "escaped"),
    [("url", "\\u0000"), ("url", "\\u001b[31m"), ("url", "\\u007f"), ("status_url", "\\u0000")],
)
def test_a_url_in_notifier_toml_with_a_control_character_exits_2_naming_it(
    ws: Workspace, key: str, escaped: str
) -> None:
    url = 'url = "http://127.0.0.1:9/n"\n'
    status = f'status_url = "http://127.0.0.1:9/s/{{key}}{escaped}"\n'
    if key == "url":
        url, status = f'url = "http://127.0.0.1:9/a{escaped}b"\n', ""
    (ws.path / "notifier.toml").write_text(
        '[channels.hooks]\ntype = "webhook"\n' + url + status + "timeout = 1\n"
    )
    ws.write_csv("b.csv", [["to", "subject"], ["ann@example.com", "Hi"]])
    result = ws.invoke("send", "b.csv", "--channel", "hooks")
    assert result.exit_code == 2, result.output
    assert f"`{key}`" in result.output and "control character" in result.output, result.output
    assert "internal error" not in result.output and "Traceback" not in result.output
    assert not ws.has_database() or ws.ledger.runs() == []


def test_a_url_from_the_environment_with_a_line_break_exits_2_naming_its_variable(
    ws: Workspace,
) -> None:
    (ws.path / "notifier.toml").write_text(
        '[channels.hooks]\ntype = "webhook"\nurl_env = "HOOKS_URL"\ntimeout = 1\n'
    )
    ws.write_csv("b.csv", [["to", "subject"], ["ann@example.com", "Hi"]])
    result = ws.invoke(
        "send", "b.csv", "--channel", "hooks", env={"HOOKS_URL": "http://127.0.0.1:9/a\nb"}
    )
    assert result.exit_code == 2, result.output
    assert "HOOKS_URL" in result.output and "Traceback" not in result.output, result.output
    assert not ws.has_database() or ws.ledger.runs() == []
