"""A PostgreSQL failover rig the tests start themselves: a private primary and a streaming standby, failed over at will.

Production runs PostgreSQL replicated (CloudNativePG, Patroni, RDS Multi-AZ), and a commit the
primary acknowledged can be missing on the standby that is promoted: only a rig that really
replicates and really promotes can show what the harness keeps across that. The machine's
server on 5432 is never touched: the rig is two private clusters (tests/support/private_cluster.py,
run as the ``postgres`` OS user, trust authentication on 127.0.0.1), each on a port of its own.

- **Two slots, two ports.** The primary is ``initdb``'ed into one slot; the standby is
  ``pg_basebackup -R`` of it (WAL streamed, a replication slot ``standby1`` so it never falls
  behind what the primary kept) in the other. The harness connects with a libpq multi-host URL
  over both ports and ``target_session_attrs=read-write`` (:meth:`FailoverRig.url`), so it
  follows the primary without being told where it is.
- **A failover** (:meth:`FailoverRig.failover`) is ``pg_ctl stop -m immediate`` of the primary
  (nothing more written, nothing handed to the standby: a crash) and ``pg_ctl promote`` of the
  standby. :meth:`FailoverRig.rebuild_standby` then makes a new standby of the new primary in the
  dead one's slot (its port, a fresh data directory), so a test can fail over again and again with
  the same URL. Each step's duration is kept in :attr:`FailoverRig.timings`.
- **Two modes.** Asynchronous (PostgreSQL's default: a commit returns once it is on the
  primary's disk) and synchronous (``synchronous_standby_names = 'ANY 1 (standby1)'``, the standby
  connecting as ``application_name=standby1``: a commit returns once the standby has it on disk).
  Every node carries the same configuration, so the promoted standby is a synchronous primary too
  — its commits wait until its own new standby streams, as a CloudNativePG cluster with
  ``dataDurability: required`` does.
- ``fsync = off``: the rig crashes processes, never the operating system, and never restarts a
  crashed primary (its directory is removed) — so nothing the tests prove rests on ``fsync``, and
  a rebuild is faster without it.

The database is migrated to head on the primary (its cluster-wide roles, ``core_jobs_api``, with
it: the migrations create them) and carries :data:`EFFECTS_TABLE`, the consumer's **independent**
record of what it did — one row per run of its work, no constraint — which :func:`tally` counts
per job against the dead letters: every job must have exactly one effect or one dead letter.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest

from support import ROOT, TESTS
from support.private_cluster import BIN_DIRS, PrivateCluster, find_bin_dir, free_port
from support.rigs import unavailable
from support.waiting import wait_until

STANDBY_NAME = "standby1"
DATABASE = "failover"
TEMPLATE = "failover_template"  # the database as migrated, with the effects table: what reset() copies back

# What every node runs with (appended after the private cluster's crash settings, which it overrides).
REPLICATION_SETTINGS = {
    "wal_level": "replica",
    "max_wal_senders": "10",
    "max_replication_slots": "10",
    "hot_standby": "on",
    "wal_writer_delay": "200ms",
    "bgwriter_lru_maxpages": "100",
    "max_connections": "60",
    "fsync": "off",
}
SYNCHRONOUS_SETTINGS = {"synchronous_standby_names": f"'ANY 1 ({STANDBY_NAME})'"}

# The consumer's own record of its work: one row per run, nothing to stop a second (that is the fence's job). And
# pg_monitor for the worker's role: the replication barrier (CORE_JOBS_WORKER_AWAIT_STANDBY) reads the standbys'
# positions.
EFFECTS_TABLE = """
CREATE TABLE public.failover_effects (
    id bigserial PRIMARY KEY,
    job_id uuid NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
GRANT SELECT, INSERT ON public.failover_effects TO core_jobs_worker;
GRANT USAGE ON SEQUENCE public.failover_effects_id_seq TO core_jobs_worker;
GRANT pg_monitor TO core_jobs_worker
"""


class Node(PrivateCluster):
    """One node of the rig: a private cluster in directory ``root`` listening on ``port``."""

    def __init__(self, bin_dir: Path, root: Path, port: int) -> None:
        root.mkdir()
        if os.geteuid() == 0:
            shutil.chown(root, "postgres", "postgres")
        super().__init__(bin_dir, root)
        self.port = port

    def configure(self, settings: dict[str, str]) -> None:
        """Append ``settings`` to postgresql.conf (a later line wins over an earlier one)."""
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.writelines(f"{name} = {value}\n" for name, value in settings.items())

    def local_settings(self) -> dict[str, str]:
        return {"port": str(self.port), "listen_addresses": "'127.0.0.1'", "unix_socket_directories": f"'{self.root}'"}

    def clone_of(self, primary: Node) -> None:
        """Make this node a streaming standby of ``primary``: a base backup with its WAL, a slot, recovery settings."""
        self._run(
            str(self.bin_dir / "pg_basebackup"),
            *("-D", str(self.data), "-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres"),
            *("-X", "stream", "-c", "fast", "--no-sync", "-R", "-C", "-S", STANDBY_NAME),
        )
        self.configure(self.local_settings())
        with open(self.data / "postgresql.auto.conf", "a") as auto:  # -R wrote one; the standby must be named
            auto.write(
                f"primary_conninfo = 'host=127.0.0.1 port={primary.port} user=postgres"
                f" application_name={STANDBY_NAME}'\n"
            )

    def reload(self) -> None:
        self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "reload")

    def promote(self) -> None:
        self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-w", "-t", "60", "promote")


@dataclass
class Timings:
    """Seconds each step took, one entry per occurrence."""

    failover: list[float] = field(default_factory=list)
    rebuild: list[float] = field(default_factory=list)


class FailoverRig:
    """A primary and a standby on two ports of their own; :meth:`failover`, :meth:`rebuild_standby`, :meth:`url`."""

    def __init__(self, bin_dir: Path, root: Path, *, synchronous: bool = False) -> None:
        self.bin_dir, self.root, self.synchronous = bin_dir, root, synchronous
        self.ports = (free_port(), free_port())
        self.timings = Timings()
        self.failovers = 0
        self._generation = 0
        self.primary = self._node(0)
        self.standby: Node | None = None
        self._held: int | None = None  # the primary's walsender stopped by hold_commits()
        self._standby_stopped = False  # by stop_standby()

    @property
    def mode(self) -> str:
        return "synchronous" if self.synchronous else "asynchronous"

    def _node(self, slot: int) -> Node:
        self._generation += 1
        return Node(self.bin_dir, self.root / f"node{self._generation}", self.ports[slot])

    def start(self) -> None:
        """The primary initdb'ed and started, the database migrated (with :data:`EFFECTS_TABLE`), a standby streaming."""
        self.primary.init()
        self.primary.configure(REPLICATION_SETTINGS | self.primary.local_settings())
        self.primary.start()
        self.primary.create_migrated_database(DATABASE)
        with psycopg.connect(self.primary_url(), autocommit=True) as conn:
            conn.execute(EFFECTS_TABLE)
        with psycopg.connect(self.primary_url("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{TEMPLATE}" TEMPLATE "{DATABASE}"')
        # Synchronous only once a standby streams: until then every commit (the migration's) would wait for it.
        synchronous, self.synchronous = self.synchronous, False
        self.rebuild_standby()
        if synchronous:
            assert self.standby is not None
            for node in (self.primary, self.standby):  # the standby too: promoted, it is a synchronous primary
                node.configure(SYNCHRONOUS_SETTINGS)
                node.reload()
            self.synchronous = True
            wait_until(self._streaming, 60, f"{STANDBY_NAME} a synchronous standby of the primary")

    def url(self, database: str = DATABASE) -> str:
        """The libpq multi-host URL over both slots that finds the read-write node, as the harness is given it."""
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.ports)
        return f"postgresql://postgres@{hosts}/{database}?target_session_attrs=read-write"

    def primary_url(self, database: str = DATABASE) -> str:
        """The current primary, directly (for arranging and counting)."""
        return self.primary.url(database)

    def failover(self) -> None:
        """The primary killed (``pg_ctl stop -m immediate``), the standby promoted; no standby until
        :meth:`rebuild_standby`. The dead primary's directory is removed: it is never restarted."""
        assert self.standby is not None, "no standby to promote: rebuild_standby() first"
        began = time.monotonic()
        if self._held is not None:  # a stopped process ignores the postmaster's SIGQUIT: it dies first
            os.kill(self._held, signal.SIGKILL)
            self._held = None
        self.primary.crash()
        self.standby.promote()
        dead, self.primary, self.standby = self.primary, self.standby, None
        self.timings.failover.append(time.monotonic() - began)
        self.failovers += 1
        shutil.rmtree(dead.root, ignore_errors=True)

    def rebuild_standby(self) -> None:
        """A new standby of the primary in the free slot, started and streaming (in synchronous mode: counted
        in the primary's quorum)."""
        assert self.standby is None, "the rig has a standby already"
        began = time.monotonic()
        free = 1 - self.ports.index(self.primary.port)
        standby = self._node(free)
        standby.clone_of(self.primary)
        standby.start()
        self.standby = standby
        wait_until(self._streaming, 60, f"{STANDBY_NAME} streaming from the primary on port {self.primary.port}")
        self.timings.rebuild.append(time.monotonic() - began)

    def _streaming(self) -> bool:
        with psycopg.connect(self.primary_url("postgres"), autocommit=True) as conn:
            row = conn.execute(
                "SELECT state, sync_state FROM pg_stat_replication WHERE application_name = %s", (STANDBY_NAME,)
            ).fetchone()
        return row is not None and row[0] == "streaming" and (row[1] == "quorum" or not self.synchronous)

    def wait_caught_up(self, timeout: float = 60) -> None:
        """Until the standby has replayed everything the primary has written so far."""
        with psycopg.connect(self.primary_url("postgres"), autocommit=True) as conn:
            target = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]

            def replayed() -> bool:
                row = conn.execute(
                    "SELECT replay_lsn >= %s::pg_lsn FROM pg_stat_replication WHERE application_name = %s",
                    (target, STANDBY_NAME),
                ).fetchone()
                return bool(row and row[0])

            wait_until(replayed, timeout, f"{STANDBY_NAME} replaying up to {target}")

    def hold_commits(self) -> int:
        """The primary's walsender stopped (SIGSTOP): what commits from now on stays on the primary, no standby gets
        it — the window asynchronous replication always has, made as wide as a test needs. Until
        :meth:`release_commits` or :meth:`failover` (which loses them). The walsender's pid."""
        assert self._held is None, "the commits are held already"
        with psycopg.connect(self.primary_url("postgres"), autocommit=True) as conn:
            (pid,) = conn.execute("SELECT pid FROM pg_stat_replication").fetchone()
        os.kill(pid, signal.SIGSTOP)
        self._held = pid
        return pid

    def release_commits(self) -> None:
        """The walsender :meth:`hold_commits` stopped goes on (SIGCONT): the standby receives what was held."""
        assert self._held is not None, "no commits are held"
        os.kill(self._held, signal.SIGCONT)
        self._held = None

    def stop_standby(self) -> None:
        """The standby stopped (``pg_ctl stop -m fast``), its directory kept: in synchronous mode every commit now
        waits for it (``wait_event = 'SyncRep'``) until :meth:`start_standby`."""
        assert self.standby is not None, "the rig has no standby"
        self.standby.stop()
        self._standby_stopped = True

    def start_standby(self) -> None:
        """The stopped standby started again and streaming (counted in the quorum again)."""
        assert self.standby is not None, "the rig has no standby"
        self.standby.start()
        self._standby_stopped = False
        wait_until(self._streaming, 60, f"{STANDBY_NAME} streaming again from the primary on port {self.primary.port}")

    def reset(self) -> None:
        """Back to a rig as :meth:`start` left it, for the next test: no commit held, a standby streaming, the database
        dropped (its connections with it: a worker a failed test left behind) and copied anew from the migrated
        template, on the standby too; the failover count and timings from zero."""
        if self._held is not None:
            self.release_commits()
        if self.standby is None:
            self.rebuild_standby()
        elif self._standby_stopped:
            self.start_standby()
        with psycopg.connect(self.primary_url("postgres"), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{DATABASE}" TEMPLATE "{TEMPLATE}"')
        self.wait_caught_up()
        self.failovers, self.timings = 0, Timings()

    def cancel_replication_waits(self) -> list[int]:
        """``pg_cancel_backend`` of every backend of the primary waiting for a synchronous standby; their pids.

        Each such COMMIT returns success with PostgreSQL's warning that it is committed locally only."""
        with psycopg.connect(self.primary_url("postgres"), autocommit=True) as conn:
            waiting = [pid for (pid,) in conn.execute("SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep'")]
            return [pid for pid in waiting if conn.execute("SELECT pg_cancel_backend(%s)", (pid,)).fetchone()[0]]

    def stop(self) -> None:
        if self._held is not None:
            self.release_commits()
        for node in (self.standby, self.primary):
            if node is not None:
                node.stop()


def rig_bin_dir(found: Path | None) -> Path:
    """The directory with initdb, pg_ctl and pg_basebackup, from :func:`find_bin_dir`'s answer ``found`` (PATH may hold
    links: their target's directory has all three); when there is none, the test is skipped or, required, failed."""
    bin_dir = (found / "initdb").resolve().parent if found else None
    if bin_dir is None or not (bin_dir / "pg_basebackup").exists():
        unavailable(f"the failover rig needs initdb, pg_ctl and pg_basebackup (on PATH or in {', '.join(BIN_DIRS)})")
    return bin_dir


@contextmanager
def failover_rig(*, synchronous: bool = False) -> Iterator[FailoverRig]:
    """A started rig (primary, standby, migrated database), stopped and removed afterwards.

    Skips (saying why) when the PostgreSQL binaries are not there — fails instead under ``CORE_JOBS_REQUIRE_CLUSTERS=1``
    (CI, tests/support/rigs.py); needs root or the ``postgres`` OS user.
    """
    bin_dir = rig_bin_dir(find_bin_dir())
    root = Path(tempfile.mkdtemp(prefix="core-jobs-failover-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    rig = FailoverRig(bin_dir, root, synchronous=synchronous)
    try:
        rig.start()
        yield rig
    finally:
        rig.stop()
        shutil.rmtree(root, ignore_errors=True)


class FailoverRigs:
    """The session's rigs, one per mode, started when first asked for and reset for each test after: a rig costs an
    initdb, a migration and a base backup, a reset a database copied from a template (the ``failover_rigs``
    fixture). A rig that cannot be reset (a test broke it beyond that) is stopped and a new one started."""

    def __init__(self) -> None:
        self._rigs: dict[bool, tuple[FailoverRig, ExitStack]] = {}
        self.starts = 0  # rigs started this session

    def fresh(self, *, synchronous: bool) -> FailoverRig:
        """The session's rig of that mode, started or :meth:`FailoverRig.reset`."""
        if synchronous in self._rigs:
            rig, stack = self._rigs[synchronous]
            try:
                rig.reset()
                return rig
            except Exception:
                del self._rigs[synchronous]
                stack.close()
        stack = ExitStack()
        rig = stack.enter_context(failover_rig(synchronous=synchronous))
        self._rigs[synchronous] = (rig, stack)
        self.starts += 1
        return rig

    def close(self) -> None:
        for _rig, stack in self._rigs.values():
            stack.close()
        self._rigs.clear()


@pytest.fixture(scope="session")
def failover_rigs() -> Iterator[FailoverRigs]:
    """The session's failover rigs (:class:`FailoverRigs`): ``failover_rigs.fresh(synchronous=…)`` in a test's fixture."""
    rigs = FailoverRigs()
    try:
        yield rigs
    finally:
        rigs.close()


@dataclass(frozen=True)
class Tally:
    """Per-job outcome counts of a run: what the promise is checked against."""

    jobs: int
    effects: int  # rows of the effects table for these jobs
    dead_letters: int  # jobs with a dead letter
    lost: list[uuid.UUID]  # neither an effect nor a dead letter
    doubled: list[uuid.UUID]  # more than one effect
    both: list[uuid.UUID]  # an effect and a dead letter

    def figures(self) -> dict[str, int]:
        return {
            "jobs": self.jobs,
            "effects": self.effects,
            "dead_letters": self.dead_letters,
            "lost": len(self.lost),
            "double": len(self.doubled),
            "effect_and_dead_letter": len(self.both),
        }


TALLY = """
SELECT j.job_id,
       (SELECT count(*) FROM public.failover_effects e WHERE e.job_id = j.job_id),
       (SELECT count(*) FROM core.dead_letters d WHERE d.job_id = j.job_id)
FROM unnest(%s::uuid[]) AS j(job_id)
"""


def tally(conn: psycopg.Connection, job_ids: Sequence[uuid.UUID]) -> Tally:
    """Count, per job of ``job_ids``, its effects and dead letters."""
    rows = conn.execute(TALLY, (list(job_ids),)).fetchall()
    return Tally(
        jobs=len(rows),
        effects=sum(effects for _, effects, _ in rows),
        dead_letters=sum(1 for _, _, letters in rows if letters),
        lost=[job for job, effects, letters in rows if not effects and not letters],
        doubled=[job for job, effects, _ in rows if effects > 1],
        both=[job for job, effects, letters in rows if effects and letters],
    )


@dataclass(frozen=True)
class SendTally:
    """Per-job outcome counts of a drain of a consumer whose NON_IDEMPOTENT_WRITE a provider counted per key."""

    jobs: int
    effects: int
    dead_letters: int
    sends: int  # requests the provider received for these jobs
    sent_twice: list[uuid.UUID]  # a key the provider received twice or more
    reconciliation: list[uuid.UUID]  # an execution RECONCILIATION_REQUIRED
    lost: list[uuid.UUID]  # no effect, no dead letter, no reconciliation
    lost_after_send: list[uuid.UUID]  # lost, and the provider had its request
    doubled: list[uuid.UUID]  # more than one effect

    def figures(self) -> dict[str, int]:
        return {
            "jobs": self.jobs,
            "effects": self.effects,
            "dead_letters": self.dead_letters,
            "sends": self.sends,
            "sent_twice": len(self.sent_twice),
            "reconciliation": len(self.reconciliation),
            "lost": len(self.lost),
            "lost_after_send": len(self.lost_after_send),
            "double": len(self.doubled),
        }


def tally_sends(
    conn: psycopg.Connection, job_ids: Sequence[uuid.UUID], sends: Counter[uuid.UUID], consumer: str
) -> SendTally:
    """Count, per job of ``job_ids``, its effects, dead letters, ``sends`` (the provider's, per job) and whether its
    execution by ``consumer`` waits for reconciliation."""
    rows = conn.execute(TALLY, (list(job_ids),)).fetchall()
    held = {
        job
        for (job,) in conn.execute(
            "SELECT job_id FROM core.executions WHERE consumer = %s AND status = 'RECONCILIATION_REQUIRED'"
            " AND job_id = ANY(%s)",
            (consumer, list(job_ids)),
        )
    }
    lost = [job for job, effects, letters in rows if not effects and not letters and job not in held]
    return SendTally(
        jobs=len(rows),
        effects=sum(effects for _, effects, _ in rows),
        dead_letters=sum(1 for _, _, letters in rows if letters),
        sends=sum(sends[job] for job in job_ids),
        sent_twice=[job for job in job_ids if sends[job] > 1],
        reconciliation=sorted(held),
        lost=lost,
        lost_after_send=[job for job in lost if sends[job]],
        doubled=[job for job, effects, _ in rows if effects > 1],
    )


def effects(conn: psycopg.Connection) -> int:
    """Rows of the effects table (every job's together): how far a drain has come."""
    return conn.execute("SELECT count(*) FROM public.failover_effects").fetchone()[0]


class SupervisedWorker:
    """``core-jobs worker`` in a subprocess on the rig's multi-host URL, started again each time it exits — what a
    supervisor (Kubernetes, systemd) does. :attr:`exits` lists the exit codes it was restarted after: a worker that
    rides out a failover by reconnecting never needs one, and the list stays empty.

    ``env``: settings of its own (``CORE_JOBS_QUEUE_URL`` for a broker). Its output goes to ``log``."""

    def __init__(self, database_url: str, consumer: str, log: Path, env: dict[str, str] | None = None) -> None:
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("CORE_JOBS_")}
        self.env = inherited | {
            "CORE_JOBS_DATABASE_URL": database_url,
            "CORE_JOBS_LOG_FORMAT": "json",
            "CORE_JOBS_WORKER_LEASE": "PT3S",  # a job whose worker died with the primary is taken again soon
            "CORE_JOBS_WORKER_POLL_INTERVAL": "PT0.1S",
            "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)]),
            **(env or {}),
        }
        self.command = [sys.executable, "-m", "maintenance", "worker", "--consumer", consumer]
        self.log = log
        self.exits: list[int] = []
        self._stopping = threading.Event()
        self._process: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._supervise, daemon=True)

    def start(self) -> SupervisedWorker:
        self._thread.start()
        return self

    def _supervise(self) -> None:
        with open(self.log, "ab") as out:
            while not self._stopping.is_set():
                with self._lock:
                    if self._stopping.is_set():
                        return
                    self._process = subprocess.Popen(self.command, cwd=ROOT, env=self.env, stdout=out, stderr=out)
                code = self._process.wait()
                if self._stopping.is_set():
                    return
                self.exits.append(code)
                self._stopping.wait(0.1)  # a supervisor's restart delay, not a test waiting for time

    @contextmanager
    def paused(self) -> Iterator[None]:
        """The worker process stopped (SIGSTOP) for the block, then let go on (SIGCONT): its drain frozen where it is."""
        with self._lock:
            process = self._process
        if process is None or process.poll() is not None:
            yield
            return
        process.send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            process.send_signal(signal.SIGCONT)

    def stop(self, timeout: float = 60) -> None:
        """SIGTERM (the worker finishes and settles what it holds), then no more restarts."""
        with self._lock:
            self._stopping.set()
            process = self._process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._thread.join(timeout)


def ended(conn: psycopg.Connection) -> int:
    """Effects, dead letters and executions held for reconciliation together: how many jobs a drain of a durable
    consumer has ended (a job held for reconciliation has no effect, and never will without an operator)."""
    return conn.execute(
        "SELECT (SELECT count(*) FROM public.failover_effects) + (SELECT count(*) FROM core.dead_letters)"
        " + (SELECT count(*) FROM core.executions WHERE status = 'RECONCILIATION_REQUIRED')"
    ).fetchone()[0]


def fail_over_mid_drain(
    rig: FailoverRig,
    *,
    failovers: int,
    jobs: int,
    timeout: float = 120,
    progress: Callable[[psycopg.Connection], int] = effects,
    worker: SupervisedWorker | None = None,
) -> list[int]:
    """Fail the primary over ``failovers`` times while a drain of ``jobs`` runs — the i-th once ``progress`` (the
    effects; :func:`ended` for a durable consumer) reaches i/(failovers + 1) of ``jobs`` — each followed by a new
    standby. Returns the progress counted just before each failover: each below ``jobs`` if it came mid-drain.

    ``worker``, the drain's, is paused while each new standby is built (:meth:`SupervisedWorker.paused`): on an
    asynchronous rig it would otherwise drain on at full speed through the rebuild (a synchronous rig's commits wait
    for the standby) and, on a loaded machine, end before the next failover."""
    counted = []
    for i in range(1, failovers + 1):
        mark = i * jobs // (failovers + 1)
        counted.append(
            wait_until(
                lambda mark=mark: _progress_at_least(rig, mark, progress), timeout, f"{mark} jobs before failover {i}"
            )
        )
        rig.failover()
        with worker.paused() if worker is not None else nullcontext():
            rig.rebuild_standby()
    return counted


def _progress_at_least(rig: FailoverRig, mark: int, progress: Callable[[psycopg.Connection], int]) -> int:
    """The progress so far when it is ``mark`` or more, else 0."""
    with psycopg.connect(rig.primary_url(), autocommit=True) as conn:
        count = progress(conn)
    return count if count >= mark else 0


def queue_empty(rig: FailoverRig, queue: str) -> bool:
    """No message of ``queue`` left in the reference queue (every one acked)."""
    with psycopg.connect(rig.primary_url(), autocommit=True) as conn:
        return not conn.execute("SELECT 1 FROM core.queue_messages WHERE queue = %s LIMIT 1", (queue,)).fetchone()
