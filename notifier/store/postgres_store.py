"""The PostgreSQL store class, imported only when a postgresql:// target is opened: psycopg's
import costs every command about 0.3 s of start-up, which `status` or `resume` on an SQLite
file must not pay."""

from __future__ import annotations

from pathlib import Path
from typing import Self

from . import Store
from .postgres import PostgresEngine


class PostgresStore(Store):
    """A receipts database in a PostgreSQL schema, shared by workers on many machines."""

    shares_runs = True

    @classmethod
    def open(cls, path: Path | str, *, create: bool = False, readonly: bool = False) -> Self:
        """The PostgreSQL engine's checked open (postgres.py), and the store over it."""
        return cls(PostgresEngine.open(path, create=create, readonly=readonly))
