"""Who is at the keyboard, for every audit (manual decisions, approvals, suppressions): one
small module, so the store can name the operator without importing the app layer."""

from __future__ import annotations

import os
import pwd


def operator_name() -> str:
    """Who is at the keyboard, for the audit: $USER, else the login name of this process's
    uid (cron, containers and `sudo -i` often leave USER unset), else the uid itself."""
    user = os.environ.get("USER")
    if user:
        return user
    uid = os.getuid()
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:  # a uid with no passwd entry (an arbitrary container uid)
        return f"uid {uid}"
