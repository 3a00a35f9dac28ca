"""Start-up: a read-only command loads none of the libraries that only sending needs."""

from __future__ import annotations

import subprocess
import sys

from ..conftest import EXAMPLE, Workspace

# HTTP, SMTP, templates, Claude and progress bars load when `send` (or `resume`) uses them.
# A look at a run needs none of them.
SENDING_ONLY = (
    "httpx2",
    "httpcore2",
    "standardwebhooks",
    "jinja2",
    "smtplib",
    "email",
    "ssl",
    "anthropic",
    "rich.progress",
    "prometheus_client",  # --metrics-port and `notifier metrics` only
)

# `python -m notifier ARGS` in a fresh interpreter, then the names of the modules it loaded,
# one a line, into the file named by the first argument.
_LOADED = """
import sys
from pathlib import Path
from notifier.cli import main

out = Path(sys.argv.pop(1))
try:
    main()
finally:
    out.write_text("\\n".join(sorted(sys.modules)))
"""


def loaded_by(ws: Workspace, *args: str) -> tuple[set[str], str]:
    """The modules `python -m notifier ARGS` loaded, run with its output on pipes, and what
    it printed."""
    out = ws.path / "modules.txt"
    done = subprocess.run(
        [sys.executable, "-c", _LOADED, str(out), "--db", str(ws.db), *args],
        cwd=ws.path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return set(out.read_text().split()), done.stdout


def test_status_loads_no_library_that_only_sending_needs(ws: Workspace) -> None:
    """`notifier status` on a database imports none of httpx2, jinja2, smtplib, email,
    ssl, standardwebhooks, anthropic or rich.progress."""
    assert ws.invoke("send", str(EXAMPLE)).exit_code == 0
    loaded, output = loaded_by(ws, "status")
    assert "completed" in output
    assert [name for name in SENDING_ONLY if name in loaded] == []


def test_send_on_a_pipe_loads_no_rich(ws: Workspace) -> None:
    """A `send` whose output goes to a pipe or a log shows no progress bar and prints no
    table: it does not load rich at all (~0.1 s of every start)."""
    loaded, _ = loaded_by(ws, "send", str(EXAMPLE))
    assert "notifier.engine.runner" in loaded  # it did send
    assert sorted(name for name in loaded if name.split(".")[0] == "rich") == []
