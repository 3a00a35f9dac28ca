"""Processes on this machine, as leases (lease.py) and abandoned plan stages (store/stage.py)
ask about them: a module of its own, so the store need not import the lease that imports it."""

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
