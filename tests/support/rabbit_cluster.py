"""A 3-node RabbitMQ cluster the tests start themselves, on ports of its own, whose nodes they may kill.

Production runs RabbitMQ as a cluster with quorum queues replicated on three nodes, and a quorum
queue's leader may die mid-drain: only a real cluster shows what the adapter keeps across that.
The machine's broker on 5672 is never touched: the rig is three nodes ``cj1@localhost`` …
``cj3@localhost`` (:data:`NODE_PORTS` for AMQP, :data:`DIST_PORTS` for Erlang distribution), each
with its own configuration file (its listener on 127.0.0.1 only, no plugin: no management
listener to clash with the machine's), its data and log directories and a private Erlang cookie
under one temporary directory owned by the ``rabbitmq`` OS user (the server and its CLI run as
that user with ``runuser`` when the tests run as root). The second and third nodes are joined to
the first with ``rabbitmqctl join_cluster``.

- **A kill** (:meth:`RabbitCluster.kill`) is SIGKILL of the node's ``beam`` process (its pid
  file): nothing said to its peers or its clients. :meth:`RabbitCluster.restart` starts it again
  on the same directories; it rejoins the cluster it knew and its quorum queue members catch up.
- **A stop** (:meth:`RabbitCluster.stop_app`) is ``rabbitmqctl stop_app``: the node stays up
  without its RabbitMQ application, as a partitioned node does to its peers (they see it gone);
  :meth:`RabbitCluster.start_app` brings it back.
- :meth:`RabbitCluster.leader` names the node leading a quorum queue (``list_queues leader``).

Startup (three nodes booted in parallel, two joins) takes about 20 s on the CI box, so the rig
is started once per pytest session: the ``rabbit_cluster`` fixture (session scope) starts it
under a file lock in the directory every xdist worker of the session shares, writes what it
started there, and a later worker reuses it; the controller process stops it at the end of the
session (``pytest_sessionfinish``). A test that kills a node restarts it before it ends
(:meth:`RabbitCluster.heal`), so the next test finds three running nodes.
"""

from __future__ import annotations

import fcntl
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pika
import pytest

from support.rabbit_support import REQUIRE_VARIABLE as REQUIRE_RABBITMQ
from support.rigs import unavailable
from support.waiting import wait_until

NODE_NAMES = ("cj1@localhost", "cj2@localhost", "cj3@localhost")
NODE_PORTS = (5701, 5702, 5703)
DIST_PORTS = (25701, 25702, 25703)
USER, PASSWORD = "cluster", "cluster-secret"  # the rig's own user: guest may connect from localhost only
STATE_FILE = "rabbit-cluster.json"
LOCK_FILE = "rabbit-cluster.lock"
START_TIMEOUT = 120


def rabbitmq_available() -> str | None:
    """Why the rig cannot run here (no server, no ``rabbitmq`` user); None when it can."""
    if shutil.which("rabbitmq-server") is None or shutil.which("rabbitmqctl") is None:
        return "the RabbitMQ cluster rig needs rabbitmq-server and rabbitmqctl (the Debian package rabbitmq-server)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("rabbitmq")
        except KeyError:
            return "the RabbitMQ cluster rig runs its nodes as the rabbitmq OS user, which does not exist"
    return None


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


class RabbitNode:
    """One node: its name, ports and directory (configuration, data, logs, pid file)."""

    def __init__(self, root: Path, index: int) -> None:
        self.name, self.port, self.dist_port = NODE_NAMES[index], NODE_PORTS[index], DIST_PORTS[index]
        self.home = root  # the private Erlang cookie is $HOME/.erlang.cookie, for the server and the CLI alike
        self.dir = root / self.name.split("@")[0]

    @property
    def pid_file(self) -> Path:
        return self.dir / "pid"

    def env(self) -> dict[str, str]:
        inherited = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))}
        return inherited | {
            "HOME": str(self.home),
            "RABBITMQ_NODENAME": self.name,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_CONF_ENV_FILE": str(self.dir / "rabbitmq-env.conf"),  # not the machine's
            "RABBITMQ_CONFIG_FILE": str(self.dir / "rabbitmq.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.dir / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(self.dir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.dir / "log"),
            "RABBITMQ_PID_FILE": str(self.pid_file),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
        }

    def write_files(self) -> None:
        self.dir.mkdir(parents=True)
        (self.dir / "rabbitmq-env.conf").write_text("")
        (self.dir / "enabled_plugins").write_text("[].\n")
        (self.dir / "rabbitmq.conf").write_text(
            f"listeners.tcp.1 = 127.0.0.1:{self.port}\n"
            "log.console = false\n"
            "log.file.level = info\n"
            # Only this rig connects: no alarm from the shared box's small disk or its memory.
            "disk_free_limit.absolute = 1MB\n"
            "vm_memory_high_watermark.relative = 0.8\n"
        )

    def pid(self) -> int | None:
        try:
            return int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None


class RabbitCluster:
    """Three nodes joined into one cluster; see the module docstring."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.nodes = [RabbitNode(root, i) for i in range(len(NODE_NAMES))]
        self._as_rabbitmq = ["runuser", "-u", "rabbitmq", "--"] if os.geteuid() == 0 else []
        self.kills = 0
        self.startup_s: float | None = None

    # -- commands ------------------------------------------------------------------------------------------------

    def ctl(self, node: RabbitNode, *args: str, timeout: float = 90, check: bool = True) -> str:
        """``rabbitmqctl -n <node> args…`` as the rabbitmq user with the rig's cookie; its output."""
        done = subprocess.run(
            [*self._as_rabbitmq, "rabbitmqctl", "-q", "-n", node.name, *args],
            env=node.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check:
            assert done.returncode == 0, f"rabbitmqctl {' '.join(args)} on {node.name}: {done.stdout}{done.stderr}"
        return done.stdout

    def _launch(self, node: RabbitNode) -> None:
        subprocess.run(
            [*self._as_rabbitmq, "rabbitmq-server", "-detached"],
            env=node.env(),
            capture_output=True,
            timeout=60,
            check=True,
        )

    def _await(self, node: RabbitNode, timeout: float = START_TIMEOUT) -> None:
        """Until ``node`` is booted and serving AMQP."""
        wait_until(lambda: _answers(node.port), timeout, f"{node.name} listening on {node.port}")
        self.ctl(node, "await_startup", "--timeout", str(int(timeout)))

    # -- life cycle ----------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Three nodes booted (in parallel), the second and third joined to the first, the rig's user created."""
        for node in self.nodes:
            busy = _answers(node.port) or _answers(node.dist_port)
            assert not busy, f"port {node.port} or {node.dist_port} is taken: a stale rig? (node {node.name})"
        began = time.monotonic()
        cookie = self.root / ".erlang.cookie"
        cookie.write_text(secrets.token_hex(20))
        cookie.chmod(0o400)
        for node in self.nodes:
            node.write_files()
        if os.geteuid() == 0:
            for path in [self.root, *self.root.rglob("*")]:
                shutil.chown(path, "rabbitmq", "rabbitmq")
        for node in self.nodes:
            self._launch(node)
        for node in self.nodes:
            self._await(node)
        first = self.nodes[0]
        for node in self.nodes[1:]:
            self.ctl(node, "stop_app")
            self.ctl(node, "join_cluster", first.name)
            self.ctl(node, "start_app")
        self.ctl(first, "add_user", USER, PASSWORD)
        self.ctl(first, "set_user_tags", USER, "administrator")
        self.ctl(first, "set_permissions", "-p", "/", USER, ".*", ".*", ".*")
        self.startup_s = time.monotonic() - began

    def stop(self) -> None:
        """Every node killed (nothing of it is kept) and the directory removed."""
        for node in self.nodes:
            pid = node.pid()
            if pid is not None:
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.root, ignore_errors=True)

    # -- faults --------------------------------------------------------------------------------------------------

    def node(self, name: str) -> RabbitNode:
        return next(node for node in self.nodes if node.name == name)

    def kill(self, node: RabbitNode) -> None:
        """SIGKILL of the node's beam process: it dies at once, saying nothing to its peers or clients."""
        pid = node.pid()
        assert pid is not None, f"{node.name} has no pid file"
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not _answers(node.port), 30, f"{node.name} gone from {node.port}")
        self.kills += 1

    def restart(self, node: RabbitNode) -> None:
        """A killed node started again on its directories: it rejoins the cluster it knew."""
        self._launch(node)
        self._await(node)

    def stop_app(self, node: RabbitNode) -> None:
        """``rabbitmqctl stop_app``: the node cut off from the cluster and its clients, its VM still up."""
        self.ctl(node, "stop_app")

    def start_app(self, node: RabbitNode) -> None:
        self.ctl(node, "start_app")
        self._await(node)

    def running(self) -> list[str]:
        """The nodes of the cluster that answer on their AMQP port."""
        return [node.name for node in self.nodes if _answers(node.port)]

    def heal(self) -> None:
        """Every node running again (a test's kills undone), so the next test finds the rig whole."""
        for node in self.nodes:
            if not _answers(node.port):
                if node.pid() is not None and _alive(node.pid()):
                    self.start_app(node)
                else:
                    self.restart(node)

    # -- reading -------------------------------------------------------------------------------------------------

    def leader(self, queue: str) -> RabbitNode:
        """The node leading quorum queue ``queue`` (asked of a running node)."""
        asked = next(node for node in self.nodes if _answers(node.port))

        def found() -> str | None:
            for line in self.ctl(asked, "list_queues", "name", "leader", check=False).splitlines():
                name, _, leader = line.partition("\t")
                if name == queue and leader.strip() in NODE_NAMES:
                    return leader.strip()
            return None

        return self.node(wait_until(found, 60, f"a leader of {queue}"))

    def members(self, queue: str) -> list[str]:
        """The nodes holding a member of quorum queue ``queue``."""
        asked = next(node for node in self.nodes if _answers(node.port))
        for line in self.ctl(asked, "list_queues", "name", "members").splitlines():
            name, _, members = line.partition("\t")
            if name == queue:
                return [m for m in NODE_NAMES if m in members]
        return []

    def messages(self, prefix: str) -> dict[str, int]:
        """Messages (ready and unacked) of every queue whose name starts with ``prefix``."""
        asked = next(node for node in self.nodes if _answers(node.port))
        rows = (line.split("\t") for line in self.ctl(asked, "list_queues", "name", "messages").splitlines())
        return {row[0]: int(row[1]) for row in rows if len(row) == 2 and row[0].startswith(prefix)}

    # -- URLs ----------------------------------------------------------------------------------------------------

    def url(self, vhost: str = "%2F") -> str:
        """The multi-host URL over the three nodes, as the adapter is given it."""
        hosts = ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)
        return f"amqp://{USER}:{PASSWORD}@{hosts}/{vhost}"

    def node_url(self, node: RabbitNode, vhost: str = "%2F") -> str:
        return f"amqp://{USER}:{PASSWORD}@127.0.0.1:{node.port}/{vhost}"

    def channel(self) -> tuple[pika.BlockingConnection, object]:
        """A plain connection and channel to a running node (for arranging and deleting)."""
        node = next(node for node in self.nodes if _answers(node.port))
        connection = pika.BlockingConnection(pika.URLParameters(self.node_url(node)))
        return connection, connection.channel()

    def delete_queues(self, prefix: str) -> None:
        connection, channel = self.channel()
        try:
            for name in self.messages(prefix):
                channel.queue_delete(name)  # type: ignore[attr-defined]
        finally:
            connection.close()

    # -- sharing between processes -------------------------------------------------------------------------------

    def state(self) -> dict[str, object]:
        return {"root": str(self.root), "startup_s": self.startup_s}

    @classmethod
    def attach(cls, state: dict[str, object]) -> RabbitCluster:
        cluster = cls(Path(str(state["root"])))
        cluster.startup_s = state.get("startup_s")  # type: ignore[assignment]
        return cluster


def _alive(pid: int | None) -> bool:
    """A running process (a killed beam may linger as a zombie until its parent reaps it: that is not alive)."""
    if pid is None:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@contextmanager
def started_cluster() -> Iterator[RabbitCluster]:
    """A started cluster in a new temporary directory, stopped and removed afterwards (the bench's)."""
    root = Path(tempfile.mkdtemp(prefix="core-jobs-rabbit-cluster-"))
    cluster = RabbitCluster(root)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _shared_dir(config: pytest.Config) -> Path:
    """The directory every process of this session shares: the controller's basetemp (an xdist worker's parent)."""
    base = config._tmp_path_factory.getbasetemp()  # type: ignore[attr-defined]
    return base.parent if hasattr(config, "workerinput") else base


@pytest.fixture(scope="session")
def rabbit_cluster(request: pytest.FixtureRequest) -> RabbitCluster:
    """The session's cluster: started by the first process that asks (under a file lock), reused by the others."""
    reason = rabbitmq_available()
    if reason is not None:
        unavailable(reason, REQUIRE_RABBITMQ)  # required in CI by either variable
    shared = _shared_dir(request.config)
    with _locked(shared / LOCK_FILE):
        state_file = shared / STATE_FILE
        if state_file.exists():
            cluster = RabbitCluster.attach(json.loads(state_file.read_text()))
            cluster.heal()
            return cluster
        root = Path(tempfile.mkdtemp(prefix="core-jobs-rabbit-cluster-"))
        cluster = RabbitCluster(root)
        try:
            cluster.start()
        except BaseException:
            cluster.stop()
            raise
        state_file.write_text(json.dumps(cluster.state()))
        return cluster


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The controller (or a run without xdist) stops the session's cluster, whichever worker started it."""
    if hasattr(session.config, "workerinput"):
        return
    try:
        state_file = _shared_dir(session.config) / STATE_FILE
    except Exception:
        return
    if state_file.exists():
        RabbitCluster.attach(json.loads(state_file.read_text())).stop()
        state_file.unlink()
