"""STDB store backends for the meta-tests: in-memory, SQLite, and PostgreSQL on a throwaway server.

The PostgreSQL server comes from the distribution's binaries (Debian: ``apt-get install postgresql``,
found under /usr/lib/postgresql/*/bin, or set ``RLCONFORM_PG_BIN``). It is created with ``initdb`` in
a fresh temporary directory, listens on a unix socket in that directory only (no TCP port), and is
stopped and deleted when the pytest session ends. Each store gets its own schema in it. The server
refuses to run as root, so as root it runs as the ``postgres`` system user (``runuser``).

Test modules import the fixtures (``from conformance_tests.stdb_backends import store_backend``); one
server per pytest process serves every module.
"""
from __future__ import annotations

import atexit
import dataclasses
import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Callable

import pytest

from reference_impl.ccapo.stdb import MemorySTDB, postgres_store, sqlite_store

# The SQLite store's text-keyed schema, from before symbols were interned: a store file in that layout must
# still open (the migration test writes one), and the text-keyed upsert floor of tools/benchmarks/bench_stdb.py.
V1_SQLITE_SCHEMA = """
CREATE TABLE stdb_edge (
    loc TEXT NOT NULL, prev_fp TEXT NOT NULL, fp TEXT NOT NULL, n_total BIGINT NOT NULL DEFAULT 0,
    n_succ BIGINT NOT NULL DEFAULT 0, d_sum DOUBLE PRECISION NOT NULL DEFAULT 0, PRIMARY KEY (loc, prev_fp, fp)
) WITHOUT ROWID;
CREATE TABLE stdb_anchor (
    loc TEXT NOT NULL, prev_fp TEXT NOT NULL, v_bar DOUBLE PRECISION NOT NULL, n_updates BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (loc, prev_fp)
) WITHOUT ROWID;
CREATE TABLE stdb_global (
    id INTEGER PRIMARY KEY CHECK (id = 1), n_succ_total BIGINT NOT NULL DEFAULT 0,
    n_total_global BIGINT NOT NULL DEFAULT 0
);
INSERT INTO stdb_global (id, n_succ_total, n_total_global) VALUES (1, 0, 0);
"""
V1_UPSERT_EDGE = (
    "INSERT INTO stdb_edge (loc, prev_fp, fp, n_total, n_succ, d_sum) VALUES (?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (loc, prev_fp, fp) DO UPDATE SET n_total = stdb_edge.n_total + excluded.n_total, "
    "n_succ = stdb_edge.n_succ + excluded.n_succ, d_sum = stdb_edge.d_sum + excluded.d_sum"
)

PG_USER = "postgres"
# synchronous_commit=off: a commit survives a client or server process crash but not an OS crash,
# the same durability as the SQLite store's WAL + synchronous=NORMAL.
PG_SETTINGS = "-c listen_addresses='' -c synchronous_commit=off -c max_connections=50"


def find_pg_bin() -> Path | None:
    """The directory holding initdb and pg_ctl: $RLCONFORM_PG_BIN, the newest /usr/lib/postgresql/N/bin, or PATH."""
    candidates = [os.environ.get("RLCONFORM_PG_BIN", "")]
    candidates += sorted((str(p) for p in Path("/usr/lib/postgresql").glob("*/bin")),
                         key=lambda p: int(Path(p).parent.name) if Path(p).parent.name.isdigit() else 0, reverse=True)
    which = shutil.which("initdb")
    candidates += [str(Path(which).resolve().parent)] if which else []
    for c in filter(None, candidates):
        if (Path(c) / "initdb").is_file() and (Path(c) / "pg_ctl").is_file():
            return Path(c)
    return None


class PostgresServer:
    """A throwaway PostgreSQL cluster in a temporary directory, reached over a unix socket."""

    def __init__(self, bindir: Path):
        self.bindir, self.dir, self._admin = bindir, None, None
        self._schemas = itertools.count()

    def _run(self, *args: str) -> None:
        as_user = ["runuser", "-u", PG_USER, "--"] if os.geteuid() == 0 else []
        out = subprocess.run([*as_user, *args], capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:2])} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")

    def start(self) -> "PostgresServer":
        self.dir = Path(tempfile.mkdtemp(prefix="rlconform-pg-"))
        if os.geteuid() == 0:
            pw = pwd.getpwnam(PG_USER)
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        data = self.dir / "data"
        self._run(str(self.bindir / "initdb"), "-D", str(data), "-U", PG_USER, "--auth=trust", "-E", "UTF8",
                  "--locale=C", "--no-sync")
        self._run(str(self.bindir / "pg_ctl"), "-D", str(data), "-l", str(self.dir / "server.log"), "-w",
                  "-t", "60", "-o", f"{PG_SETTINGS} -k {self.dir}", "start")
        atexit.register(self.stop)  # also on an interrupted session
        return self

    @property
    def dsn(self) -> str:
        return f"host={self.dir} port=5432 user={PG_USER} dbname=postgres"

    def fresh_dsn(self) -> str:
        """A DSN whose tables land in a new, empty schema."""
        import psycopg

        if self._admin is None:
            self._admin = psycopg.connect(self.dsn, autocommit=True)
        name = f"stdb_{os.getpid()}_{next(self._schemas)}"
        self._admin.execute(f"CREATE SCHEMA {name}")
        return f"{self.dsn} options='-c search_path={name}'"

    def stop(self) -> None:
        if self.dir is None:
            return
        if self._admin is not None:
            self._admin.close()
            self._admin = None
        try:
            self._run(str(self.bindir / "pg_ctl"), "-D", str(self.dir / "data"), "-m", "fast", "-w", "stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


_SERVER: list[PostgresServer] = []


def postgres_server(config: pytest.Config | None = None) -> PostgresServer:
    """The one server of this process (started on first use, stopped when the session ends); skips
    with the reason when the binaries or the driver are missing."""
    if not _SERVER:
        bindir = find_pg_bin()
        if bindir is None:
            pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl) found: apt-get install postgresql, "
                        "or set RLCONFORM_PG_BIN")
        try:
            import psycopg  # noqa: F401
        except ImportError:
            pytest.skip('psycopg 3 is not installed: pip install "psycopg[binary]>=3.1"')
        _SERVER.append(PostgresServer(bindir).start())
        if config is not None:
            config.add_cleanup(_SERVER[0].stop)
    return _SERVER[0]


@dataclasses.dataclass(frozen=True)
class Backend:
    """A way to make stores: ``new()`` gives a fresh empty location; ``open(location, **params)`` a
    store on it (several processes may open one location when ``shared``)."""
    name: str
    new: Callable[[], str]
    open: Callable[..., Any]
    shared: bool


def _memory() -> Backend:
    return Backend("memory", lambda: "", lambda _loc, **kw: MemorySTDB(**kw), shared=False)


def _sqlite(tmp: Path) -> Backend:
    counter = itertools.count()
    return Backend("sqlite", lambda: str(tmp / f"stdb{next(counter)}.sqlite"),
                   lambda loc, **kw: sqlite_store(loc, **kw), shared=True)


def _postgres(server: PostgresServer) -> Backend:
    return Backend("postgresql", server.fresh_dsn, lambda loc, **kw: postgres_store(loc, **kw), shared=True)


def make_backend(name: str, request: pytest.FixtureRequest) -> Backend:
    if name == "memory":
        return _memory()
    if name == "sqlite":
        return _sqlite(request.getfixturevalue("tmp_path_factory").mktemp("stdb"))
    return _postgres(postgres_server(request.config))


@pytest.fixture(scope="session", params=["memory", "sqlite", "postgresql"])
def store_backend(request) -> Backend:
    """Every backend (the store contract and the update rules)."""
    return make_backend(request.param, request)


@pytest.fixture(scope="session", params=["sqlite", "postgresql"])
def shared_backend(request) -> Backend:
    """The backends several processes share (concurrency and crash tests)."""
    return make_backend(request.param, request)
