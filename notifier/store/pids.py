"""Processes on this machine, as leases (engine/membership.py) and abandoned plan stages
(store/stage.py) ask about them."""

from __future__ import annotations

import os


def pid_exists(pid: int) -> bool:
    """Whether a process `pid` exists on this machine (one we may not signal counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
