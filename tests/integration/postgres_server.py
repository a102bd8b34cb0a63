"""A throw-away PostgreSQL server for the test session, started as an operator would.

``postgres_server`` (session scope) runs ``initdb`` and ``pg_ctl start`` in a fresh
folder under /tmp: data, log and unix socket inside it, ``listen_addresses = ''``
(no TCP at all), trust authentication (only the folder's owner, and root, can
enter the folder and so reach the socket), durability off (nothing here must
survive a crash). initdb refuses to run as root, so as root every server command
runs as the ``postgres`` system user (``runuser``), which owns the folder. At the
end of the session, failed or not, the server is stopped with ``pg_ctl stop -m
immediate`` and the folder removed.

``postgres_url`` (function scope) creates a fresh database for one test and drops
it afterwards, so tests never see each other's rows.

Missing binaries FAIL the tests with the command that installs them: these tests
must really run in CI, and a skip would hide that they did not.

Test modules import both fixtures; the server is one per session however many
modules import them (it is kept in ``config.stash``, and stopped by a cleanup
registered on the config, which runs once at the very end).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest

from tests.hang import HANG_SECONDS, INNER_HANG_SECONDS

#: Seconds to wait for the server to accept connections: a hang bound, not a pace
#: (pg_ctl's own wait inside the command's, so pg_ctl's message comes first).
STARTUP_SECONDS = INNER_HANG_SECONDS
#: The database superuser initdb creates.
SUPERUSER = "postgres"
#: Where Debian's and Ubuntu's packages put the server binaries (not on PATH).
PACKAGE_BIN_GLOB = "/usr/lib/postgresql/*/bin"
INSTALL_HINT = (
    "PostgreSQL server binaries (initdb, pg_ctl, postgres) are needed for the store's "
    "PostgreSQL tests and were not found on PATH or in /usr/lib/postgresql/*/bin: "
    "install them with `apt-get install postgresql` (Debian/Ubuntu)"
)


@dataclass
class PostgresServer:
    """A running server: its folder, where its socket is, and how long it took to start."""

    root: Path
    bin_dir: Path
    run_as: list[str]
    startup_seconds: float
    databases: list[str] = field(default_factory=list)

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def socket_dir(self) -> Path:
        return self.root

    def url(self, dbname: str, **extra: str) -> str:
        """A ``postgresql:///`` URL to ``dbname`` over the unix socket."""
        params = {"host": str(self.socket_dir), "user": SUPERUSER, **extra}
        query = "&".join(f"{k}={quote(v, safe='/')}" for k, v in params.items())
        return f"postgresql:///{dbname}?{query}"

    def admin(self) -> psycopg.Connection[tuple[object, ...]]:
        """An autocommit connection to the ``postgres`` maintenance database."""
        return psycopg.connect(self.url("postgres"), autocommit=True)

    def create_database(self) -> str:
        name = f"capgate_{uuid.uuid4().hex[:16]}"
        with self.admin() as conn:
            conn.execute(f'CREATE DATABASE "{name}"'.encode())
        self.databases.append(name)
        return name

    def drop_database(self, name: str) -> None:
        with self.admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())
        if name in self.databases:
            self.databases.remove(name)


def find_bin_dir() -> Path:
    """The folder holding initdb, pg_ctl and postgres; pytest.fail if there is none."""
    names = ("initdb", "pg_ctl", "postgres")
    on_path = [shutil.which(name) for name in names]
    if all(on_path):
        folders = {Path(p).resolve().parent for p in on_path if p}
        if len(folders) == 1:
            return folders.pop()
    candidates = sorted(
        Path("/").glob(PACKAGE_BIN_GLOB.lstrip("/")),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
        reverse=True,
    )
    for folder in candidates:
        if all((folder / name).is_file() for name in names):
            return folder
    pytest.fail(INSTALL_HINT, pytrace=False)


def _owner() -> tuple[list[str], int, int]:
    """The command prefix to run server commands with, and the uid/gid to own its files."""
    if os.geteuid() != 0:
        return [], os.geteuid(), os.getegid()
    try:
        user = pwd.getpwnam(SUPERUSER)
    except KeyError:
        pytest.fail(
            "running as root, the PostgreSQL tests start the server as the `postgres` "
            "system user (initdb refuses root), and there is none: `apt-get install "
            "postgresql` creates it",
            pytrace=False,
        )
    runuser = shutil.which("runuser")
    if runuser is None:
        pytest.fail("running as root needs `runuser` (util-linux) to start PostgreSQL")
    return [runuser, "-u", SUPERUSER, "--"], user.pw_uid, user.pw_gid


def _run(cmd: list[str], root: Path, what: str, timeout: float) -> None:
    done = subprocess.run(
        cmd,
        cwd=root,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        log = root / "server.log"
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        raise RuntimeError(
            f"{what} failed (exit {done.returncode}):\n{done.stdout[-2000:]}\n"
            f"{done.stderr[-2000:]}\n{tail}"
        )


def start_postgres() -> PostgresServer:
    """initdb + pg_ctl start in a new folder; returns once it accepts connections."""
    bin_dir = find_bin_dir()
    run_as, uid, gid = _owner()
    began = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="capgate-pg-", dir="/tmp"))
    server = PostgresServer(root=root, bin_dir=bin_dir, run_as=run_as, startup_seconds=0.0)
    try:
        os.chown(root, uid, gid)
        _run(
            [
                *run_as,
                str(bin_dir / "initdb"),
                "--pgdata",
                str(server.data_dir),
                "--username",
                SUPERUSER,
                "--auth",
                "trust",
                "--encoding",
                "UTF8",
                "--locale",
                "C",
                "--no-sync",
                "--no-instructions",
            ],
            root,
            "initdb",
            HANG_SECONDS,
        )
        settings = {
            "listen_addresses": "''",
            "unix_socket_directories": f"'{root}'",
            "max_connections": "100",
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "log_min_messages": "warning",
        }
        with (server.data_dir / "postgresql.conf").open("a", encoding="utf-8") as conf:
            conf.write("\n# capgate test server\n")
            conf.writelines(f"{key} = {value}\n" for key, value in settings.items())
        _run(
            [
                *run_as,
                str(bin_dir / "pg_ctl"),
                "--pgdata",
                str(server.data_dir),
                "--log",
                str(root / "server.log"),
                "--wait",
                "--timeout",
                str(STARTUP_SECONDS),
                "start",
            ],
            root,
            "pg_ctl start",
            HANG_SECONDS,
        )
        _wait_accepting(server)
        server.startup_seconds = time.monotonic() - began
        return server
    except BaseException:
        stop_postgres(server)
        raise


def _wait_accepting(server: PostgresServer) -> None:
    deadline = time.monotonic() + STARTUP_SECONDS
    while True:
        try:
            with server.admin() as conn:
                conn.execute(b"SELECT 1")
            return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def stop_postgres(server: PostgresServer) -> None:
    """Stop the server at once and remove its folder (whatever state it is in)."""
    try:
        if (server.data_dir / "postmaster.pid").exists():
            subprocess.run(
                [
                    *server.run_as,
                    str(server.bin_dir / "pg_ctl"),
                    "--pgdata",
                    str(server.data_dir),
                    "--mode",
                    "immediate",
                    "--wait",
                    "stop",
                ],
                cwd=server.root,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=HANG_SECONDS,  # it must stop; past this the session fails
                check=False,
            )
    finally:
        shutil.rmtree(server.root, ignore_errors=True)


_SERVER_KEY = pytest.StashKey[PostgresServer]()


@pytest.fixture(scope="session")
def postgres_server(request: pytest.FixtureRequest) -> PostgresServer:
    """One PostgreSQL server for the whole session, stopped when the session ends."""
    config = request.config
    server = config.stash.get(_SERVER_KEY, None)
    if server is None:
        server = start_postgres()
        config.stash[_SERVER_KEY] = server
        config.add_cleanup(lambda: stop_postgres(server))
    return server


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> Iterator[str]:
    """A URL to a database of its own for one test, dropped afterwards."""
    name = postgres_server.create_database()
    try:
        yield postgres_server.url(name)
    finally:
        postgres_server.drop_database(name)
