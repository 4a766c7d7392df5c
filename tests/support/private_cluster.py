"""A private PostgreSQL cluster of one test module, which the test may crash (``pg_ctl stop -m immediate``).

The shared test server must never be crashed or reconfigured, so a test that needs a real
server crash, or ``ALTER SYSTEM`` / ``ALTER ROLE`` defaults, starts its own: ``initdb`` into a
temporary directory owned by the ``postgres`` OS user (run with ``runuser`` when the tests run
as root: PostgreSQL refuses to run as root), listening on a free port of 127.0.0.1 only, trust
authentication. :data:`CRASH_SETTINGS` make a lost asynchronous commit reliable rather than a
race: the WAL writer writes the WAL buffers every 10 s only (its maximum), the background writer
writes no data pages (whose WAL would be written first) and nothing checkpoints on its own. An
immediate stop kills the server without writing anything more: what was still in the WAL
buffers — an asynchronous commit — is gone after the restart, while what was written to the
operating system survives (this is a server crash, not a power cut).

:func:`private_cluster` skips the test, with the reason, when ``initdb`` cannot be found — or fails it under
``CORE_JOBS_REQUIRE_CLUSTERS=1`` (CI, tests/support/rigs.py).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from maintenance.runtime import migrate
from support.rigs import unavailable

BIN_DIRS = ("/usr/lib/postgresql/17/bin", "/usr/lib/postgresql/16/bin", "/usr/lib/postgresql/15/bin")

CRASH_SETTINGS = {
    "wal_writer_delay": "10s",
    "bgwriter_lru_maxpages": "0",
    "checkpoint_timeout": "1h",
    "max_wal_size": "1GB",
    "autovacuum": "off",
    "max_connections": "30",
    "shared_buffers": "16MB",
}


def find_bin_dir() -> Path | None:
    """Where initdb and pg_ctl are: PATH first, else the Debian locations; None when neither has them."""
    on_path = shutil.which("initdb")
    if on_path and shutil.which("pg_ctl"):
        return Path(on_path).parent
    for candidate in BIN_DIRS:
        if (Path(candidate) / "initdb").exists() and (Path(candidate) / "pg_ctl").exists():
            return Path(candidate)
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrivateCluster:
    """One initdb'ed cluster: :meth:`start`, :meth:`crash` (immediate stop), :meth:`url` of a database."""

    def __init__(self, bin_dir: Path, root: Path) -> None:
        self.bin_dir, self.root = bin_dir, root
        self.data = root / "data"
        self.port = free_port()
        self._as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def _run(self, *args: str) -> None:
        done = subprocess.run([*self._as_postgres, *args], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{args[0]} failed: {done.stdout}{done.stderr}"

    def init(self) -> None:
        self._run(str(self.bin_dir / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync")
        settings = CRASH_SETTINGS | {
            "port": str(self.port),
            "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": f"'{self.root}'",
        }
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.writelines(f"{name} = {value}\n" for name, value in settings.items())

    def start(self) -> None:
        log = str(self.root / "server.log")
        self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-l", log, "-w", "-t", "60", "start")

    def crash(self) -> None:
        """``pg_ctl stop -m immediate``: the server dies at once, nothing more written (a crash)."""
        self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def stop(self) -> None:
        subprocess.run(
            [*self._as_postgres, str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"],
            capture_output=True,
            timeout=120,
        )

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def create_migrated_database(self, name: str) -> str:
        """A new database migrated to head; its URL."""
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        url = self.url(name)
        migrate.upgrade(url)
        return url


@contextmanager
def private_cluster() -> Iterator[PrivateCluster]:
    """A started private cluster, stopped and removed afterwards; skips (or, required, fails) when initdb is unavailable."""
    bin_dir = find_bin_dir()
    if bin_dir is None:
        unavailable(f"a private PostgreSQL cluster needs initdb and pg_ctl (not on PATH, nor in {', '.join(BIN_DIRS)})")
    root = Path(tempfile.mkdtemp(prefix="core-jobs-cluster-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    cluster = PrivateCluster(bin_dir, root)
    try:
        cluster.init()
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
