"""The PostgreSQL server the test suite runs against: GPUBOT_TEST_POSTGRES_URL, or a throwaway one.

The throwaway cluster lives in a temp dir, listens on a free loopback port, and is deleted at exit.
"""

from __future__ import annotations

import glob
import os
import pwd
import shlex
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import psycopg
from psycopg import sql
from sqlmodel import SQLModel

from storage import migrate
from storage.db import Database, normalise_url

URL_ENV = "GPUBOT_TEST_POSTGRES_URL"
_SYSTEM_USER = "postgres"  # created by Debian's postgresql package; initdb refuses root
_MISSING = (
    "PostgreSQL is not installed: the storage tests run on PostgreSQL as well as SQLite. "
    "Run `make test` (it installs Debian's postgresql package), or point "
    f"{URL_ENV} at a server where the user may CREATE DATABASE."
)


class PostgresUnavailableError(RuntimeError):
    """No server was configured and none could be started here."""


class PostgresServer:
    """A running server on which tests create and drop their own databases; a throwaway one
    can also be stopped and started again (`stop`, `start`) to test what an outage does."""

    def __init__(self, url: str, control: Sequence[str] = ()) -> None:
        self.url = normalise_url(url)
        self._control = list(control)  # [runner..., pg_ctl, -D, data, -l, log, -o, options]
        # Unique per run so that two runs sharing one external server never collide.
        self._prefix = f"gpubot_test_{uuid.uuid4().hex[:8]}"
        self._count = 0
        self._scratch: str | None = None
        self._schema: str | None = None  # the catalog's print right after the schema was built
        self._migrated: str | None = None  # a database at the head of the migrations, to copy

    def stop(self) -> None:
        """Stop the server now (pg_ctl -m fast): connections are cut, new ones refused."""
        if not self._control:
            raise PostgresUnavailableError("only a throwaway server can be stopped")
        _run([], *self._control, "-m", "fast", "-w", "stop")

    def start(self) -> None:
        if not self._control:
            raise PostgresUnavailableError("only a throwaway server can be started")
        _run([], *self._control, "-w", "start")

    def url_for(self, name: str) -> str:
        return self.url.set(database=name).render_as_string(hide_password=False)

    def _admin(self) -> psycopg.Connection[tuple[object, ...]]:
        # CREATE/DROP DATABASE cannot run inside a transaction block.
        conninfo = self.url.set(drivername="postgresql").render_as_string(hide_password=False)
        return psycopg.connect(conninfo, autocommit=True)

    def create_database(self) -> str:
        """Create a new empty database and return its name."""
        self._count += 1
        name = f"{self._prefix}_{self._count}"
        with self._admin() as admin:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return name

    def create_database_from(self, template: str) -> str:
        """Create a new database as a copy of `template` (nobody may be connected to it)."""
        self._count += 1
        name = f"{self._prefix}_{self._count}"
        statement = sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
            sql.Identifier(name), sql.Identifier(template)
        )
        with self._admin() as admin:
            admin.execute(statement)
        return name

    def migrated_database(self) -> str:
        """Create a new database at the head of the migrations and return its name: a copy of
        one migrated once per run, as tests/support/sqlite.py does for SQLite files (the
        migrations keep their own tests, from empty databases)."""
        if self._migrated is None:
            name = self.create_database()
            migrate.upgrade(self.url_for(name))  # leaves no connection open: it can be copied
            self._migrated = name
        return self.create_database_from(self._migrated)

    def drop_database(self, name: str) -> None:
        statement = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        with self._admin() as admin:
            admin.execute(statement)

    def database_with_schema(self) -> Database:
        """The run's scratch database with every table and no rows, as a fresh one would be.

        The first call builds the schema. Later calls delete the rows and restart the sequences
        (a few ms) when the catalog is as that build left it; a test that changed the schema
        gets it dropped and built afresh (~300 ms on a loaded machine, as every call once did).
        """
        if self._scratch is None:
            self._scratch = self.create_database()
        database = Database(self.url_for(self._scratch))
        if self._schema is not None and self._emptied(database):
            return database
        with database.begin() as connection:
            # A connection some test leaked would hold its locks forever; fail, do not hang.
            connection.exec_driver_sql("SET LOCAL lock_timeout = '10s'")
            connection.exec_driver_sql("DROP SCHEMA public CASCADE")
            connection.exec_driver_sql("CREATE SCHEMA public")
        database.create_all()
        with database.begin() as connection:
            self._schema = str(connection.exec_driver_sql(_SCHEMA_PRINT).scalar_one())
        return database

    def _emptied(self, database: Database) -> bool:
        """Empty every table and restart every sequence, when the schema is the one built;
        False (nothing done) when a test changed it."""
        with database.begin() as connection:
            connection.exec_driver_sql("SET LOCAL lock_timeout = '10s'")
            if connection.exec_driver_sql(_SCHEMA_PRINT).scalar_one() != self._schema:
                return False
            # Children before parents, so no foreign key is ever left dangling. A table
            # grown large is truncated instead, so later tests do not scan its dead rows.
            large = {
                str(name)
                for (name,) in connection.exec_driver_sql(
                    "SELECT relname FROM pg_class WHERE relnamespace = 'public'::regnamespace "
                    "AND relkind = 'r' AND pg_relation_size(oid) > 1048576"
                )
            }
            ordered = [table.name for table in reversed(SQLModel.metadata.sorted_tables)]
            if large:
                names = ", ".join(_quoted(name) for name in ordered if name in large)
                connection.exec_driver_sql(f"TRUNCATE {names} CASCADE")
            # One round trip; the names are our own tables'.
            deletes = [f"DELETE FROM {_quoted(name)}" for name in ordered if name not in large]  # noqa: S608
            connection.exec_driver_sql("; ".join(deletes))
            connection.exec_driver_sql(
                "SELECT setval(s.seqrelid, s.seqstart, false) FROM pg_sequence s "
                "JOIN pg_class c ON c.oid = s.seqrelid "
                "WHERE c.relnamespace = 'public'::regnamespace"
            )
        return True

    def drop_all(self) -> None:
        """Drop what this run created on a server it does not own (the scratch database and
        the migrated one)."""
        if self._scratch is not None:
            self.drop_database(self._scratch)
            self._scratch = None
        if self._migrated is not None:
            self.drop_database(self._migrated)
            self._migrated = None


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


# What a test could change in the scratch database's schema, printed as one text: every
# relation of `public` with its columns, defaults, options and row security, the constraints,
# index definitions, user triggers, policies, functions, types and enum labels, and which
# schemas and extensions exist. Equal prints mean the tables are the ones create_all built.
_SCHEMA_PRINT = """
SELECT md5(coalesce(string_agg(item, E'\\n' ORDER BY item), '')) FROM (
  SELECT format('rel %s %s %s %s %s', c.relname, c.relkind, c.relpersistence, c.reloptions,
         c.relrowsecurity) || coalesce((
           SELECT string_agg(format(' %s:%s:%s:%s:%s', a.attnum, a.attname,
                  format_type(a.atttypid, a.atttypmod), a.attnotnull,
                  pg_get_expr(d.adbin, d.adrelid)), '' ORDER BY a.attnum)
           FROM pg_attribute a
           LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
           WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped), '') AS item
    FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace
  UNION ALL
  SELECT format('con %s %s %s', conrelid::regclass, conname, pg_get_constraintdef(oid))
    FROM pg_constraint WHERE connamespace = 'public'::regnamespace
  UNION ALL
  SELECT 'idx ' || pg_get_indexdef(i.indexrelid) FROM pg_index i
    JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relnamespace = 'public'::regnamespace
  UNION ALL
  SELECT format('trg %s %s', tgrelid::regclass, pg_get_triggerdef(oid))
    FROM pg_trigger WHERE NOT tgisinternal
  UNION ALL
  SELECT format('pol %s %s', polrelid::regclass, polname) FROM pg_policy
  UNION ALL
  SELECT format('fn %s', oid::regprocedure) FROM pg_proc
    WHERE pronamespace = 'public'::regnamespace
  UNION ALL
  SELECT format('type %s %s', typname, typtype) FROM pg_type
    WHERE typnamespace = 'public'::regnamespace
  UNION ALL
  SELECT format('enum %s %s %s', enumtypid::regtype, enumsortorder, enumlabel) FROM pg_enum
  UNION ALL
  SELECT 'schema ' || nspname FROM pg_namespace
  UNION ALL
  SELECT 'ext ' || extname FROM pg_extension
) AS catalog
"""


def find_binaries() -> Path | None:
    """The bin/ folder of the newest PostgreSQL Debian installed, or None."""
    found = sorted(
        (Path(path).parent for path in glob.glob("/usr/lib/postgresql/*/bin/initdb")),
        key=lambda folder: int(folder.parent.name) if folder.parent.name.isdigit() else 0,
    )
    found = [folder for folder in found if (folder / "pg_ctl").exists()]
    return found[-1] if found else None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _runner() -> tuple[list[str], pwd.struct_passwd | None]:
    if os.geteuid() != 0:
        return [], None
    try:
        account = pwd.getpwnam(_SYSTEM_USER)
    except KeyError:
        raise PostgresUnavailableError(
            f"running as root and there is no `{_SYSTEM_USER}` user to run PostgreSQL as. "
            + _MISSING
        ) from None
    runuser = shutil.which("runuser")
    if runuser is None:
        raise PostgresUnavailableError("running as root and `runuser` is missing")
    return [runuser, "-u", _SYSTEM_USER, "--"], account


def _run(prefix: Sequence[str], *args: str, log: Path | None = None) -> None:
    try:
        subprocess.run(  # noqa: S603  (our own arguments, no shell)
            [*prefix, *args], check=True, capture_output=True, text=True, timeout=120
        )
    except subprocess.TimeoutExpired as failure:
        raise PostgresUnavailableError(f"{Path(args[0]).name} did not finish: {failure}") from None
    except subprocess.CalledProcessError as failure:
        server_log = log.read_text(errors="replace") if log and log.exists() else ""
        raise PostgresUnavailableError(
            f"{Path(args[0]).name} failed ({failure.returncode}):\n"
            f"{failure.stdout}{failure.stderr}{server_log}"
        ) from failure


@contextmanager
def throwaway_server() -> Iterator[PostgresServer]:
    """Start a private cluster, fsync off (nothing in it must survive a crash); delete it after."""
    binaries = find_binaries()
    if binaries is None:
        raise PostgresUnavailableError(_MISSING)
    prefix, account = _runner()
    root = Path(tempfile.mkdtemp(prefix="gpubot-pg-"))
    data, sockets, log = root / "data", root / "sockets", root / "server.log"
    try:
        sockets.mkdir()
        if account is not None:
            for path in (root, sockets):
                os.chown(path, account.pw_uid, account.pw_gid)
        initdb = [str(binaries / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust"]
        _run(prefix, *initdb, "-E", "UTF8", "--no-locale", "--no-sync")
        port = _free_port()
        options = (
            f"-c listen_addresses=127.0.0.1 -p {port} -k {shlex.quote(str(sockets))} "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        )
        pg_ctl = str(binaries / "pg_ctl")
        control = [*prefix, pg_ctl, "-D", str(data), "-l", str(log), "-o", options]
        _run(prefix, pg_ctl, "-D", str(data), "-l", str(log), "-o", options, "-w", "start", log=log)
        try:
            yield PostgresServer(
                f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres", control
            )
        finally:
            if (data / "postmaster.pid").exists():  # a test may have stopped it already
                _run(prefix, pg_ctl, "-D", str(data), "-m", "immediate", "-w", "stop", log=log)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def server() -> Iterator[PostgresServer]:
    """The server named by GPUBOT_TEST_POSTGRES_URL, else a throwaway one."""
    url = os.environ.get(URL_ENV)
    if not url:
        with throwaway_server() as started:
            yield started
        return
    external = PostgresServer(url)
    try:
        yield external
    finally:
        external.drop_all()
