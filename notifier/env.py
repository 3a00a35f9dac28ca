"""What a command works in (its database, its configuration, where it says things), and how
a command that looks at a run begins: it opens the store and picks the run. Apart from
app.py, which loads everything sending needs, so that `status`, `report` and `runs` start
without it."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .config import Config
from .errors import BadInput
from .records import Run
from .state_machine import FINISHED_RUN_STATES
from .store import Store, is_postgres

Say = Callable[[str], None]


@dataclass(frozen=True)
class Env:
    db_path: Path | str  # an SQLite file, or a postgresql:// URL
    config: Config
    say: Say

    @property
    def base_dir(self) -> Path:
        """Where relative channel paths (an outbox) are resolved: beside an SQLite file,
        else the working directory."""
        return Path.cwd() if is_postgres(self.db_path) else Path(self.db_path).parent

    def may_hold_runs(self) -> bool:
        """Whether a read-only look may find runs (a server always may; a file must exist)."""
        return is_postgres(self.db_path) or Path(self.db_path).exists()


def open_store(env: Env, *, create: bool = False, readonly: bool = False) -> Store:
    if not is_postgres(env.db_path):
        _refuse_dangling_link(Path(env.db_path))
    return Store.open(env.db_path, create=create, readonly=readonly)


def _refuse_dangling_link(path: Path) -> None:
    """A --db that is a symbolic link to nothing can be neither opened nor created (the link
    is in the way): say so, instead of a FileNotFoundError from deep in the store."""
    if not path.is_symlink() or path.exists():
        return
    target = Path(os.readlink(path))
    shown = target if target.is_absolute() else path.parent / target
    raise BadInput(
        f"{path} is a symbolic link to {shown}, which does not exist (or cannot be "
        "resolved), so notifier can neither open a database there nor create one. Restore "
        "the database it pointed to or fix the link, or point --db (or NOTIFIER_DB) at the "
        "database file itself (a new path starts a new database); nothing was changed."
    )


def pick_run(store: Store, run_id: str | None, *, active_only: bool = False) -> Run:
    """RUN_ID, or the newest run (for resume and cancel: the newest not completed or
    cancelled)."""
    if run_id is not None:
        try:
            return store.get_run(run_id)
        except KeyError:
            raise BadInput(
                f"{store.path}: no run {run_id!r}. `notifier runs` lists the runs.",
            ) from None
    run = store.newest_run(exclude=FINISHED_RUN_STATES if active_only else ())
    if run is None:
        what = "unfinished run" if active_only else "run"
        raise BadInput(f"{store.path}: there is no {what}. `notifier runs` lists the runs.")
    return run
