"""The --db target, parsed once: an SQLite file or a PostgreSQL URL. What the commands need
to know of it is asked in their own terms (where relative paths resolve, whether a run can be
shared among processes, whether it may hold runs yet, how to open it), so that nothing above
store/ asks which engine it names. Neither driver is imported until a target is opened."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Protocol
from urllib.parse import urlsplit

from notifier.domain.errors import BadInput, NotifierError

if TYPE_CHECKING:
    from notifier.store.backend import Engine

SCHEMES = ("postgresql://", "postgres://")
# A URL's scheme (RFC 3986): what comes before `://` in a --db that is some URL.
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")
# A libpq keyword/value connection string ("host=… user=… password=…", as a hosting
# provider hands it out): not a file name, and not what --db takes. This catches one libpq
# itself would refuse (a keyword misspelt further on), which _is_conninfo does not call one.
_CONNINFO = re.compile(
    r"\s*(host|hostaddr|port|dbname|user|password|passfile|service|sslmode|sslpassword"
    r"|options|connect_timeout|application_name)\s*=",
)
_FROM_THE_ENVIRONMENT = (
    "notifier never reads a password from --db or NOTIFIER_DB (it would sit in shell history "
    "and process lists): set PGPASSWORD, or add it to ~/.pgpass"
)


class NotADatabasePath(ValueError):
    """A --db that cannot name a database at all (a directory)."""


class Target(Protocol):
    # Whether many processes may work one run at once, each under a worker lease of its own
    # (`notifier worker`); as the store over its engine says (Store.shares_runs).
    shares_runs: ClassVar[bool]

    @property
    def local_dir(self) -> Path:
        """Where relative channel paths (an outbox) are resolved."""
        ...

    def may_hold_runs(self) -> bool:
        """Whether a read-only look may find runs here, before anything is opened."""
        ...

    def damage(self, exc: BaseException) -> NotifierError | None:
        """The damaged database `exc`, met while reading this one, shows; None for anything
        else (a read outside any write transaction, which no storage_failure names)."""
        ...

    def engine(
        self, *, create: bool = False, readonly: bool = False, audited: bool = False
    ) -> Engine:
        """The checked engine (StoreRefused, NoDatabase, …) that Store.open builds on;
        `audited`, read-only, skips the check of rows against each other (`verify`)."""
        ...


def parse(db: str | Path) -> Target:
    """The target --db (or NOTIFIER_DB) names: a postgresql:// URL (its scheme in any case),
    else an SQLite file. NotADatabasePath for a directory, a libpq connection string, a URL
    of another kind, or a URL that holds a password, each named without the text given,
    which may hold it."""
    if isinstance(db, str):
        if not db.strip():
            # An unset variable expanded in a script: not the current directory.
            raise NotADatabasePath(
                "--db is empty; give the path of an SQLite file (receipts.db) or a "
                "postgresql://USER@HOST:PORT/DATABASE URL. Nothing was opened."
            )
        # Read past surrounding whitespace (a stray space from a YAML or .env file): such a
        # URL is still one, never an SQLite file named after its password.
        scheme, sep, rest = db.strip().partition("://")
        if sep and scheme.lower() + sep in SCHEMES:
            return _postgres_url(scheme.lower() + sep + rest)
        if sep and _SCHEME.fullmatch(scheme.strip()):
            # Another database's URL, or SQLAlchemy's spelling of one (sqlite:///x,
            # postgresql+psycopg://): as a path it would be a file under directories named
            # after its parts, its password among them.
            raise NotADatabasePath(
                "--db is a URL of a kind notifier does not use; it takes the path of an "
                "SQLite file (receipts.db) or a postgresql://USER@HOST:PORT/DATABASE URL, its "
                "password in PGPASSWORD or ~/.pgpass, never in --db. Nothing was opened."
            )
        if _CONNINFO.match(db) or _is_conninfo(db):
            raise NotADatabasePath(
                "--db looks like a libpq connection string (keyword=value …), which it does "
                "not take: write it as postgresql://USER@HOST:PORT/DATABASE; "
                f"{_FROM_THE_ENVIRONMENT}. Nothing was opened."
            )
    path = Path(db)
    if path.is_dir():
        raise NotADatabasePath(f"{db} is a directory; name a file in it.")
    return SqliteFile(path)


def _is_conninfo(db: str) -> bool:
    """Whether libpq reads `db` as a keyword/value connection string (any of its keywords,
    not only those _CONNINFO names: `gssencmode=… password=…` is one too)."""
    if "=" not in db:
        return False
    from psycopg import ProgrammingError  # noqa: PLC0415 - only for a text holding '='
    from psycopg.conninfo import conninfo_to_dict  # noqa: PLC0415

    try:
        conninfo_to_dict(db)
    except ProgrammingError:
        return False  # not libpq's: a file name with '=' in it
    return True


def _secret_parameters() -> set[str]:
    """The parameters libpq marks as secret (password, sslpassword, oauth_client_secret in
    libpq 18, ...: PQconndefaults' dispchar '*'), and the SCRAM keys, which authenticate as
    the password does."""
    from psycopg import pq  # noqa: PLC0415 - only for a PostgreSQL target

    marked = {o.keyword.decode() for o in pq.Conninfo.get_defaults() if o.dispchar == b"*"}
    return marked | {"password", "scram_client_key", "scram_server_key"}


def _postgres_url(db: str) -> PostgresUrl:
    """`db` as a PostgresUrl, refused if it cannot be read or holds a password as libpq
    reads it (urllib reads `postgres:pa#ss@host` as holding none)."""
    from psycopg import ProgrammingError  # noqa: PLC0415 - only for a PostgreSQL target
    from psycopg.conninfo import conninfo_to_dict  # noqa: PLC0415

    try:
        urlsplit(db)  # what it refuses, libpq may read another way: refused too
        parameters = conninfo_to_dict(db)
    except (ValueError, ProgrammingError) as exc:
        # Named without the URL itself, which may hold a password: urllib's NFKC refusal
        # quotes the whole netloc, userinfo and all, and libpq's the part it could not read.
        reason = (
            "a character in it becomes / ? # @ or : under NFKC normalization"
            if "NFKC" in str(exc)
            else "libpq cannot read it"
            if isinstance(exc, ProgrammingError)
            else "urllib cannot read it"
        )
        raise NotADatabasePath(
            f"the postgresql:// URL cannot be read ({reason}). Write it as "
            "postgresql://USER@HOST:PORT/DATABASE (an IPv6 host in brackets, [::1]); "
            "nothing was opened."
        ) from None
    if any(parameters.get(name) is not None for name in _secret_parameters()):
        # Secrets come from the environment only. Named without the URL itself.
        raise NotADatabasePath(
            f"the postgresql:// URL holds a password; {_FROM_THE_ENVIRONMENT}. Drop it from the "
            "URL; nothing was opened."
        )
    return PostgresUrl(db)


@dataclass(frozen=True)
class SqliteFile:
    """A receipts database in one SQLite file, worked by one process at a time."""

    path: Path
    shares_runs: ClassVar[bool] = False

    @property
    def local_dir(self) -> Path:
        return self.path.parent  # beside the file: the outbox travels with its database

    def may_hold_runs(self) -> bool:
        return self.path.exists()

    def damage(self, exc: BaseException) -> NotifierError | None:
        from notifier.store.sqlite import undecodable_text  # noqa: PLC0415 - as engine()

        return undecodable_text(exc, self.path)

    def engine(
        self, *, create: bool = False, readonly: bool = False, audited: bool = False
    ) -> Engine:
        _refuse_dangling_link(self.path)
        from notifier.store.sqlite import SqliteEngine  # noqa: PLC0415 - only when a target is opened

        return SqliteEngine.open(self.path, create=create, readonly=readonly, audited=audited)

    def __str__(self) -> str:
        return str(self.path)


@dataclass(frozen=True)
class PostgresUrl:
    """A receipts database in a PostgreSQL schema, whose runs workers on many machines may
    share."""

    url: str = field(repr=False)  # may hold a password: never in a message or a repr
    shares_runs: ClassVar[bool] = True

    @property
    def local_dir(self) -> Path:
        return Path.cwd()  # a server has no directory of ours: where the command runs

    def may_hold_runs(self) -> bool:
        return True  # only the server can say, once connected

    def damage(self, exc: BaseException) -> NotifierError | None:
        return None  # the server refuses text that is not UTF-8 when it is written

    def engine(
        self, *, create: bool = False, readonly: bool = False, audited: bool = False
    ) -> Engine:
        # psycopg only when a server is named (see postgres.py).
        from notifier.store.postgres import PostgresEngine  # noqa: PLC0415

        return PostgresEngine.open(self.url, create=create, readonly=readonly, audited=audited)

    def __str__(self) -> str:
        from notifier.store.postgres import describe  # noqa: PLC0415 - psycopg, only for a message

        return describe(self.url)


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
