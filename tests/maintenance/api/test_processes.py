"""`core-jobs api` in several processes (CORE_JOBS_API_PROCESSES, issue 29): one socket, metrics and stops across them.

Which child accepts a connection is the kernel's choice; to send a request to a chosen child the
others are paused (SIGSTOP) meanwhile: a stopped process accepts nothing, the one left takes it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import prometheus_client
import psycopg
from prometheus_client import values
from support.api_support import AUDIENCE, ISSUER
from support.factories import QUEUE, add_dead_letters
from support.harness_support import scalar
from support.waiting import wait_until

BASE = "/v1/core/dead-letters"


class Served:
    """A `core-jobs api` process tree: its parent process and every event it and its children logged so far."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.process, self.events, self.stderr = process, [], ""
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()
        self.started = self.event("maintenance.api.started")
        self.url = f"http://127.0.0.1:{self.started['port']}"

    def _read(self) -> None:
        for line in self.process.stdout:
            self.events.append(json.loads(line))

    def _read_stderr(self) -> None:
        self.stderr = self.process.stderr.read()

    def named(self, name: str) -> list[dict]:
        return [e for e in list(self.events) if e["event"] == name]

    def event(self, name: str, count: int = 1) -> dict:
        """The ``count``-th event ``name``, once logged."""
        return wait_until(
            lambda: len(self.named(name)) >= count and self.named(name)[count - 1],
            what=f"{name} #{count} (stderr: {self.stderr[-2000:]})",
        )

    def children(self) -> list[int]:
        """The pids of the children serving now (started, not yet reported exited)."""
        exited = {e["pid"] for e in self.named("maintenance.api.process_exited")}
        return [e["pid"] for e in self.named("maintenance.api.process_started") if e["pid"] not in exited]


@contextlib.contextmanager
def served(database_url: str, jwks_url: str, processes: int = 2, **extra: str) -> Iterator[Served]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORE_JOBS_")} | {
        "CORE_JOBS_DATABASE_URL": database_url,
        "CORE_JOBS_API_JWKS_URL": jwks_url,
        "CORE_JOBS_API_JWT_ISSUER": ISSUER,
        "CORE_JOBS_API_JWT_AUDIENCE": AUDIENCE,
        "CORE_JOBS_API_PROCESSES": str(processes),
        "CORE_JOBS_LOG_FORMAT": "json",
        **extra,
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "maintenance", "api", "--host", "127.0.0.1", "--port", "0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        server = Served(process)
        if processes > 1:
            wait_until(lambda: len(server.children()) == processes, what=f"{processes} children started")
            # Started is the fork: a child serves, and counts itself in core_jobs_api_processes, once its app is up.
            wait_until(
                lambda: sample(scrape(server.url), "core_jobs_api_processes") == processes,
                what=f"{processes} children serving",
            )
        yield server
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@contextlib.contextmanager
def only(server: Served, child: int) -> Iterator[None]:
    """Every other child paused (SIGSTOP) for the block: ``child`` alone accepts new connections."""
    others = [pid for pid in server.children() if pid != child]
    for pid in others:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in others:
            os.kill(pid, signal.SIGCONT)


def sample(text: str, name: str, labels: str = "") -> float | None:
    match = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.M)
    return float(match.group(1)) if match else None


HEALTHZ = '{method="GET",route="/healthz",status="200"}'


def scrape(url: str) -> str:
    return httpx.get(f"{url}/metrics").text  # a connection of its own: any child answers


def lock_waiters(database_url: str) -> int:
    """API sessions of this test's database waiting on a lock, seen from a session of its own (a transaction
    sees pg_stat_activity as of its first look)."""
    with psycopg.connect(database_url, autocommit=True) as watcher:
        return scalar(
            watcher,
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'core-jobs-api'"
            " AND wait_event_type = 'Lock' AND datname = current_database()",
        )


def gone(pid: int) -> bool:
    """No such process any more (a zombie counts as gone: it serves nothing)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state == "Z"


def test_metrics_add_up_every_process_and_keep_a_replaced_ones_counts(database_url, jwks):
    """/healthz answered 3 times by one child and 4 by the other: whichever answers /metrics counts 7, and
    still 7 after the second is killed and replaced; core_jobs_api_processes is 2 throughout, never 3."""
    with served(database_url, jwks.url) as server:
        first, second = server.children()
        with only(server, first):
            assert [httpx.get(f"{server.url}/healthz").status_code for _ in range(3)] == [200] * 3
        with only(server, second):
            assert [httpx.get(f"{server.url}/healthz").status_code for _ in range(4)] == [200] * 4
        for child in (first, second):
            with only(server, child):
                text = scrape(server.url)
                assert sample(text, "core_jobs_api_requests_total", HEALTHZ) == 7
                assert sample(text, "core_jobs_api_request_duration_seconds_count", HEALTHZ) == 7
                assert sample(text, "core_jobs_api_processes") == 2

        os.kill(second, signal.SIGKILL)
        exited = server.event("maintenance.api.process_exited")
        assert (exited["pid"], exited["signal"]) == (second, "SIGKILL")
        replacement = server.event("maintenance.api.process_started", 3)["pid"]
        assert server.children() == [first, replacement]
        with only(server, replacement):
            wait_until(lambda: httpx.get(f"{server.url}/readyz").status_code == 200, what="the replacement ready")
            text = scrape(server.url)
        assert sample(text, "core_jobs_api_requests_total", HEALTHZ) == 7
        assert sample(text, "core_jobs_api_processes") == 2


def test_one_idempotency_key_sent_to_two_processes_at_once_has_one_effect(database_url, jwks, tokens, conn):
    """The same replay with one key, to one child and then (while the first waits) to the other: one message
    queued, both answered 200 with the same body, the second from the ledger (the ledger is in PostgreSQL)."""
    letter = add_dead_letters(conn, QUEUE, 1)[0]
    headers = {"Authorization": f"Bearer {tokens.token()}", "Idempotency-Key": "two-processes"}
    answers: dict[int, httpx.Response] = {}

    def replay(child: int) -> None:
        answers[child] = httpx.post(f"{server.url}{BASE}/{letter}/replay", headers=headers, timeout=60)

    with served(database_url, jwks.url) as server:
        first, second = server.children()
        requests = []
        with conn.transaction():
            conn.execute("SELECT 1 FROM core.dead_letters WHERE id = %s FOR UPDATE", (letter,))
            for count, child in enumerate((first, second), start=1):
                with only(server, child):
                    requests.append(threading.Thread(target=replay, args=(child,)))
                    requests[-1].start()
                    wait_until(lambda: lock_waiters(database_url) == count, what=f"{count} API sessions waiting")  # noqa: B023
        for request in requests:
            request.join(60)
    assert [answers[c].status_code for c in (first, second)] == [200, 200]
    assert answers[first].content == answers[second].content
    assert "idempotent-replayed" not in answers[first].headers
    assert answers[second].headers["idempotent-replayed"] == "true"
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages") == 1
    assert scalar(conn, "SELECT count(*) FROM core.api_idempotency_keys") == 1


def test_sigterm_stops_every_process_after_its_request_in_flight(database_url, jwks, tokens, conn):
    """SIGTERM to the parent while a child's replay waits on a lock: the replay completes (200), every child
    exits, the parent logs stopping once and stopped, and exits 0."""
    letter = add_dead_letters(conn, QUEUE, 1)[0]
    answers: list[httpx.Response] = []
    with served(database_url, jwks.url) as server:
        children = server.children()
        with conn.transaction():
            conn.execute("SELECT 1 FROM core.dead_letters WHERE id = %s FOR UPDATE", (letter,))
            request = threading.Thread(
                target=lambda: answers.append(
                    httpx.post(
                        f"{server.url}{BASE}/{letter}/replay",
                        headers={"Authorization": f"Bearer {tokens.token()}"},
                        timeout=60,
                    )
                )
            )
            request.start()
            wait_until(lambda: lock_waiters(database_url) == 1, what="the replay waiting on the row lock")
            server.process.send_signal(signal.SIGTERM)
            assert server.event("maintenance.api.stopping")["signal"] == "SIGTERM"
        request.join(60)
        assert server.process.wait(60) == 0
        assert [a.status_code for a in answers] == [200]
        assert scalar(conn, "SELECT status FROM core.dead_letters") == "replayed"
        assert server.event("maintenance.api.stopped")["port"] == server.started["port"]
        assert len(server.named("maintenance.api.stopping")) == 1
        assert server.named("maintenance.api.process_exited") == []  # each stopped as asked
        assert all(gone(pid) for pid in children)


def test_the_children_stop_when_the_parent_is_killed(database_url, jwks):
    """SIGKILL to the parent (no chance to pass anything on): its children get SIGTERM from the kernel and exit."""
    with served(database_url, jwks.url) as server:
        children = server.children()
        server.process.kill()
        server.process.wait()
        wait_until(lambda: all(gone(pid) for pid in children), what="the orphaned children gone")


def test_a_multi_process_serve_leaves_the_test_process_and_the_disk_untouched(database_url, jwks):
    """PROMETHEUS_MULTIPROC_DIR exists only in the served processes: after one ran, scraped and stopped, this
    process's environment, prometheus_client's value class and its global registry are as before, and the
    run's metrics directory is gone."""
    environment = dict(os.environ)
    value_class = values.ValueClass
    registered = sorted(prometheus_client.REGISTRY._names_to_collectors)
    with served(database_url, jwks.url) as server:
        directory = Path(server.started["metrics_directory"])
        assert directory.is_dir() and directory.stat().st_mode & 0o077 == 0  # private to the server's user
        assert sample(scrape(server.url), "core_jobs_api_processes") == 2
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(60) == 0
    assert not directory.exists()
    assert "PROMETHEUS_MULTIPROC_DIR" not in os.environ and dict(os.environ) == environment
    assert values.ValueClass is value_class and not value_class._multiprocess
    assert sorted(prometheus_client.REGISTRY._names_to_collectors) == registered


def test_one_process_serves_alone_without_a_metrics_directory(database_url, jwks):
    """The default, one process: no children, no metrics directory, the gauge says 1."""
    with served(database_url, jwks.url, processes=1) as server:
        assert server.started["processes"] == 1 and server.started["metrics_directory"] is None
        assert sample(scrape(server.url), "core_jobs_api_processes") == 1
