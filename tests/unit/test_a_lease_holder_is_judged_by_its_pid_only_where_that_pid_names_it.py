"""Whether a lease's holder may still be working a run (membership.holder_alive): by its pid,
dead at once once that process is gone, only where the pid names a process this one can see,
on this host and in this PID namespace (`pid_space`). Anywhere else (another host, a container
with the host's network and so its host name but pids of its own, a holder recorded before
the pid space was, a process whose /proc entry is hidden) the holder is trusted until its lease
expires: taken for dead early, it would be fenced out while it may still be sending."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from notifier.engine import membership
from notifier.engine.membership import HOST, PID_SPACE, holder_alive, process_start

from ..conftest import wait_for

UNEXPIRED = "2999-01-01T00:00:00+00:00"
EXPIRED = "2001-01-01T00:00:00+00:00"

pytestmark = pytest.mark.skipif(PID_SPACE is None, reason="needs /proc (Linux)")


@pytest.fixture
def live_pid() -> Iterator[int]:
    """A process of this machine, alive for the test."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield process.pid
    finally:
        process.kill()
        process.wait()


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def _owner(pid: int, **changes: Any) -> dict[str, Any]:
    owner = {"host": HOST, "pid_space": PID_SPACE, "pid": pid, "started": process_start(pid),
             "token": "t"}  # fmt: skip
    owner.update(changes)
    return owner


def test_a_holder_here_whose_process_is_gone_is_dead_at_once() -> None:
    dead = _dead_pid()
    assert not holder_alive(_owner(dead, started="12345"), UNEXPIRED)


def test_a_holder_here_that_has_exited_uncollected_is_dead_at_once() -> None:
    """A zombie: exited, its exit status not collected yet by its parent."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    owner = _owner(child.pid)
    try:
        # /proc is readable here: no start time means the child has exited, uncollected.
        wait_for(lambda: process_start(child.pid) is None, "the child has exited")
        assert not holder_alive(owner, UNEXPIRED)
    finally:
        child.wait()


def test_a_holder_here_whose_pid_now_names_another_process_is_dead(live_pid: int) -> None:
    assert holder_alive(_owner(live_pid), UNEXPIRED)
    assert not holder_alive(_owner(live_pid, started="1"), UNEXPIRED)  # a recycled pid


@pytest.mark.parametrize("pid", ["gone", "another process"])
def test_a_holder_of_this_host_name_in_another_pid_namespace_is_trusted_until_its_lease_expires(
    pid: str, live_pid: int
) -> None:
    """Its pid means nothing here: absent, or some other process of this namespace."""
    number = _dead_pid() if pid == "gone" else live_pid
    other = _owner(number, pid_space="another-boot pid:[1]", started="7")
    assert holder_alive(other, UNEXPIRED)
    assert not holder_alive(other, EXPIRED)


def test_a_holder_recorded_without_its_pid_space_is_trusted_until_its_lease_expires() -> None:
    """As every lease written before the pid space was recorded (and a worker row before
    migration m015): its pid is not known to name a process this one sees."""
    old = _owner(_dead_pid(), started="7")
    del old["pid_space"]
    assert holder_alive(old, UNEXPIRED)
    assert not holder_alive(old, EXPIRED)


def test_a_holder_whose_proc_entry_cannot_be_read_is_trusted_until_its_lease_expires(
    live_pid: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/proc hides another user's processes (hidepid, ProtectProc=invisible): the pid exists,
    its start time cannot be read. Not known dead."""
    owner = _owner(live_pid)
    monkeypatch.setattr(membership, "_stat", lambda pid: None)  # /proc/PID/stat hidden
    assert holder_alive(owner, UNEXPIRED)
    assert not holder_alive(owner, EXPIRED)


def test_this_process_records_where_its_pid_means_it() -> None:
    owner = membership.new_owner()
    assert owner["pid"] == os.getpid() and owner["pid_space"] == PID_SPACE
    assert owner["started"] == process_start(os.getpid())
