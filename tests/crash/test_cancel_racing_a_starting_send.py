"""A cancel racing a send process that is starting never exits 1 (an illegal move)."""

from __future__ import annotations

import functools
import subprocess
import sys

import pytest

from notifier.sandbox.server import Sandbox

from ..conftest import Workspace, default_sigint, make_rows
from ..engine.test_cancel import (
    CANCEL_AS_SOON_AS_PLANNED,
    configure_hooks,
    started_polling,
    wait_for,
)

pytestmark = pytest.mark.both_stores


@pytest.mark.slow
@pytest.mark.parametrize("trial", range(6))
def test_cancel_racing_a_starting_send_never_exits_1(ws: Workspace, trial: int) -> None:
    """A cancel that fires the moment a `send` has stored its plan (run still planned, the
    lease about to be taken) lands in each trial on one side of the race or the other; neither
    process exits 1 (illegal move, lost race) or 4, and the run ends cancelled or completed."""
    with Sandbox() as sandbox:
        configure_hooks(ws, sandbox, query=True)
        ws.write_csv(f"batch{trial}.csv", make_rows(5, start=100 * trial))
        polling = ws.path / f"polling{trial}"
        canceller = subprocess.Popen(
            [sys.executable, "-c", CANCEL_AS_SOON_AS_PLANNED, str(ws.db), str(polling)],
            cwd=ws.path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=default_sigint,  # noqa: PLW1509 (as every process a test starts)
        )
        # The canceller is polling before the send starts.
        wait_for(functools.partial(started_polling, polling, canceller))
        assert canceller.poll() is None, canceller.communicate()
        # The send in this process, racing the canceller's.
        sender = ws.invoke("send", f"batch{trial}.csv", "--channel", "hooks")
        out, err = canceller.communicate(timeout=60)
        assert sender.exit_code in (0, 3), sender.output
        assert canceller.returncode in (0, 3), out + err
        assert "internal error" not in sender.stderr + err
        assert ws.ledger.run().state in ("cancelled", "completed")
