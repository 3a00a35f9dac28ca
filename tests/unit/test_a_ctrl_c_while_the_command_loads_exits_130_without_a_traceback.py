"""Ctrl-C in the first moments of a command, while Python still loads the command line
(a few hundred milliseconds, before any signal handler is installed and before anything is
read or stored): exit 130, as the contract says of Ctrl-C, never Python's KeyboardInterrupt
traceback and exit -2. The entry point (`notifier`, `python -m notifier`) loads it inside
its guard."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec
from types import ModuleType

import pytest

from notifier.__main__ import run

pytestmark = pytest.mark.timeout(30)


class _CtrlCWhileLoading(MetaPathFinder):
    """Ctrl-C arriving while `notifier.cli` is being imported."""

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if name == "notifier.cli":
            raise KeyboardInterrupt
        return None


def test_ctrl_c_while_the_command_line_loads_exits_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delitem(sys.modules, "notifier.cli")
    monkeypatch.setattr(sys, "meta_path", [_CtrlCWhileLoading(), *sys.meta_path])
    with pytest.raises(SystemExit) as ended:
        run()
    assert ended.value.code == 130
    assert "Traceback" not in capsys.readouterr().err
