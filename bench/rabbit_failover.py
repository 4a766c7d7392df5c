"""What a RabbitMQ node loss mid-drain costs the promise — alone, or with a PostgreSQL failover in the same drain.

    uv run python bench/rabbit_failover.py                       # 10 leader kills and 1 stopped node, 2000 jobs of 100 ms
    uv run python bench/rabbit_failover.py --kills 12 --stops 2 --jobs 3000
    uv run python bench/rabbit_failover.py --mode both           # and the PostgreSQL primary lost at the first kill

Each run starts the 3-node RabbitMQ cluster rig (tests/support/rabbit_cluster.py: ``cj1..cj3@localhost`` on
5701-5703; the machine's broker is not used) and the PostgreSQL failover rig (tests/support/failover.py: a private
primary and a streaming standby, ``--replication`` synchronous by default; the machine's server is not used). A
producer thread publishes ``--jobs`` jobs of the rig's effect consumer (one row of an independent effects table per
run of its work, ``--work-ms`` each) on the cluster's multi-host URL while a supervised ``core-jobs worker`` drains
them on the same URL and the database's multi-host URL (tests/support/rabbit_failover.py). Meanwhile the quorum
queue's leader node is SIGKILLed ``--kills`` times and its application stopped (``rabbitmqctl stop_app``, a node cut
off) ``--stops`` times, each at the next mark of the drain and followed by the node's restart; in ``--mode both`` the
PostgreSQL primary is also killed and the standby promoted right after the first broker kill, before the broker
node comes back.

Printed: kills, stops, database failovers, jobs, effects, dead letters, **lost** (no effect, no dead letter),
**double** (two effects or more), an effect and a dead letter, the publishes the adapter sent again (nacked or
unconfirmed when a leader died), the producer's resumed publish calls, the worker's broker reconnections and
restarts (a worker that follows the cluster by itself has none), whether the work queue kept its delivery limit,
its members, the drain's wall time, the cluster's startup time and the load average.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support import failover
from support.rabbit_cluster import started_cluster
from support.rabbit_failover import drain_with_broker_faults


def run(mode: str, *, kills: int, stops: int, jobs: int, work_ms: int, synchronous: bool) -> dict[str, object]:
    with failover.failover_rig(synchronous=synchronous) as rig, started_cluster() as cluster:

        def database_failover() -> None:
            rig.failover()
            rig.rebuild_standby()

        figures = drain_with_broker_faults(
            cluster,
            database_url=rig.primary_url,  # the current primary, after a failover too
            worker_database_url=rig.url(),
            jobs=jobs,
            kills=kills,
            stops=stops,
            work_ms=work_ms,
            database_failover=database_failover if mode == "both" else None,
            timeout=600,
        )
        return {
            "mode": mode,
            "replication": rig.mode,
            **figures,
            "cluster_start_s": round(cluster.startup_s or 0, 1),
            "load": Path("/proc/loadavg").read_text().split()[0],
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("broker", "both"), action="append")
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--stops", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--work-ms", type=int, default=100, help="how long each job's work holds its transaction")
    parser.add_argument("--replication", choices=("synchronous", "asynchronous"), default="synchronous")
    args = parser.parse_args(argv)
    columns = [
        "mode",
        "replication",
        "kills",
        "stops",
        "database_failovers",
        "after_drain",
        "jobs",
        "effects",
        "dead_letters",
        "lost",
        "double",
        "effect_and_dead_letter",
        "publishes_retried",
        "producer_errors",
        "reconnections",
        "worker_restarts",
        "delivery_limit_kept",
        "members",
        "drain_s",
        "cluster_start_s",
        "load",
    ]
    print(" ".join(columns), flush=True)
    for mode in args.mode or ["broker"]:
        row = run(
            mode,
            kills=args.kills,
            stops=args.stops,
            jobs=args.jobs,
            work_ms=args.work_ms,
            synchronous=args.replication == "synchronous",
        )
        print(" ".join(str(row[c]) for c in columns), flush=True)
        print(f"  faults {row['faults']}; log {row['log']}", flush=True)
        if row["lost_ids"] or row["doubled_ids"]:
            print(f"  lost {row['lost_ids'][:5]} doubled {row['doubled_ids'][:5]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
