"""The PostgreSQL store class, imported only when a postgresql:// target is opened: psycopg's
import costs every command about 0.3 s of start-up, which `status` or `resume` on an SQLite
file must not pay."""

from __future__ import annotations

from . import Store
from .postgres import PostgresOpening


class PostgresStore(PostgresOpening, Store):
    """A receipts database in a PostgreSQL schema, shared by workers on many machines."""

    shares_runs = True
    # LOWER lower-cases ASCII letters only under the "C" collation, as SQLite's does: plan
    # time matches a suppressed address alike on both engines (suppressions.py). The result
    # is compared in the database's collation, the primary key's: compared under "C", the
    # claim's probe could not use the key and scanned the whole list for every row.
    _ADDRESS_OF = '(LOWER(TRIM({}) COLLATE "C") COLLATE "default")'
