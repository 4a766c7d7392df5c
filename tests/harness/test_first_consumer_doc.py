"""docs/harness.md's first consumer, exactly as the doc shows it: it type-checks under ``mypy --strict`` and runs.

The code block under "A first consumer" is extracted as it stands (``credit_member.py``), written to a
folder of this test's own, checked by mypy in strict mode, then imported and its ``main`` run against this
test's migrated database: one job published in the producer's transaction, one processed, 50 points.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from support.harness_support import scalar

DOC = Path(__file__).resolve().parents[2] / "docs" / "harness.md"
HEADING = "## A first consumer"


def first_consumer() -> str:
    """The first ```python block after the heading: the doc's consumer, byte for byte."""
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index(HEADING) :]
    start = section.index("```python\n") + len("```python\n")
    return section[start : section.index("\n```", start) + 1]


@pytest.fixture
def credit_member(tmp_path: Path) -> Path:
    path = tmp_path / "credit_member.py"
    path.write_text(first_consumer(), encoding="utf-8")
    return path


def test_the_docs_first_consumer_passes_mypy_strict(credit_member: Path):
    """`mypy --strict credit_member.py`: no error, the harness's types included (it ships py.typed)."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-incremental",
            "--config-file",
            "/dev/null",
            str(credit_member),
        ],
        cwd=credit_member.parent,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success: no issues found in 1 source file" in result.stdout


def test_the_docs_first_consumer_runs_against_postgresql_and_credits_once(credit_member: Path, database_url, conn):
    """Its main(): the producer's job committed with its table, the worker processes it once, 50 points, one fence."""
    spec = importlib.util.spec_from_file_location("credit_member", credit_member)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    stats = module.main(database_url)

    assert (stats.processed, stats.dead_lettered, stats.retried) == (1, 0, 0)
    assert scalar(conn, "SELECT points FROM public.member_points WHERE member_id = 'm-42'") == 50
    assert scalar(conn, "SELECT count(*) FROM core.processed_jobs WHERE consumer = 'credit_member'") == 1
    assert scalar(conn, "SELECT count(*) FROM core.queue_messages") == 0


def test_the_docs_first_consumer_dead_letters_a_closed_member_at_once(credit_member: Path, database_url, conn):
    """Its PermanentError: a closed member's job is a dead letter after one attempt, no points."""
    spec = importlib.util.spec_from_file_location("credit_member_closed", credit_member)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with psycopg.connect(database_url) as producer:
        module.order_paid(producer, "closed-7", 5)
        producer.commit()
    worker = module.Worker(
        database_url,
        module.consumer,
        policy=module.RetryPolicy(),
        config=module.WorkerConfig(fence_ttl=module.timedelta(days=7)),
    )
    assert worker.run(once=True).dead_lettered == 1
    assert scalar(conn, "SELECT count(*) FROM public.member_points WHERE member_id = 'closed-7'") == 0
    assert scalar(conn, "SELECT attempts FROM core.dead_letters WHERE consumer = 'credit_member'") == 1
