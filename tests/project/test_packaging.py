"""Packaging: the consumer harness is a distribution of its own, installable without the jobs (issue 10, item 8).

These tests build wheels with uv and install one into a fresh virtualenv, so they need PyPI or a
warm uv cache: offline, deselect them with ``-m "not network"``. CI runs them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from support import ROOT

pytestmark = pytest.mark.network


# What a consumer service must not get from the harness: the jobs' own dependencies and our other top-level packages.
NOT_IN_A_CONSUMER = (
    "apscheduler",
    "alembic",
    "pgserver",
    "prometheus_client",
    "sqlalchemy",
    "httpx",
    "pydantic_settings",
    "maintenance",
    "alerts",
    "migrations",
)

# Run by the fresh virtualenv's Python (argv[1]: a migrated database): import every harness module (the test kits
# of harness.testing aside: they need pytest, and say so), say which
# forbidden modules could be imported, handle one job through the fence with the default metrics.
STANDALONE_CHECK = r"""
import importlib, importlib.util, json, pkgutil, sys, uuid
from datetime import timedelta

import psycopg
import harness

modules = sorted(m.name for m in pkgutil.walk_packages(harness.__path__, "harness."))
# What an extra or a test suite brings: the RabbitMQ adapter needs pika (the `rabbitmq` extra), the test kits pytest.
OPTIONAL = ("harness.queue.rabbitmq", "harness.testing")
for name in modules:
    if not name.startswith(OPTIONAL):
        importlib.import_module(name)
needs = {}
for name in OPTIONAL:
    try:
        importlib.import_module(name)
        needs[name] = None
    except ModuleNotFoundError as exc:
        needs[name] = exc.name

from harness import Delivery, Envelope, HarnessMetrics, RetryPolicy, handle
from harness.examples.points import consumer

job_id = uuid.uuid4()
envelope = Envelope(job_id=job_id, payload={"member_id": "m-1", "points": 5},
                    tenant_id=uuid.UUID("00000000-0000-4000-8000-0000000000aa"))
with psycopg.connect(sys.argv[1], autocommit=True) as conn:
    outcome = handle(conn, consumer, Delivery(queue=consumer.queue, envelope=envelope, attempt=1),
                     policy=RetryPolicy(), fence_ttl=timedelta(days=7))
    fences = conn.execute("SELECT count(*) FROM core.processed_jobs WHERE job_id = %s", (job_id,)).fetchone()[0]
try:
    HarnessMetrics()
    prometheus_error = None
except ImportError as exc:
    prometheus_error = str(exc)
print(json.dumps({
    "harness_file": harness.__file__,
    "unresolved": [name for name in harness.__all__ if not hasattr(harness, name)],
    "modules": modules,
    "importable": [m for m in sys.argv[2:] if importlib.util.find_spec(m) is not None],
    "outcome": type(outcome).__name__,
    "fences": fences,
    "prometheus_error": prometheus_error,
    "needs": needs,
}))
"""


def uv() -> str:
    found = os.environ.get("UV") or shutil.which("uv")  # `uv run` sets UV to its own path
    if not found:
        pytest.fail("uv is not on PATH: the packaging tests build and install with it")
    return found


def run(*args: str | Path, cwd: Path = ROOT, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, f"{' '.join(map(str, args))} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def wheel_in(directory: Path, distribution: str) -> Path:
    [wheel] = directory.glob(f"{distribution}-*.whl")
    return wheel


def metadata(wheel: Path) -> dict[str, list[str]]:
    with zipfile.ZipFile(wheel) as archive:
        [name] = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        message = Parser().parsestr(archive.read(name).decode())
    return {
        "Requires-Dist": message.get_all("Requires-Dist") or [],
        "Provides-Extra": message.get_all("Provides-Extra") or [],
    }


def top_level(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return {n.split("/")[0] for n in archive.namelist() if not n.split("/")[0].endswith(".dist-info")}


@pytest.fixture(scope="session")
def dists(tmp_path_factory) -> Path:
    """The harness's sdist and the wheel built from it, and core-jobs's wheel, built as a release would."""
    out = tmp_path_factory.mktemp("dist")
    run(uv(), "build", "--package", "core-jobs-harness", "--out-dir", out)  # the wheel is built from the sdist
    run(uv(), "build", "--package", "core-jobs", "--wheel", "--out-dir", out)
    return out


def test_the_harness_wheel_holds_the_harness_package_and_nothing_else(dists):
    """core-jobs-harness's wheel has harness/ (all its modules, the example too, py.typed) and its dist-info, nothing else:
    the operator's side (maintenance/operations/) is not a consumer's."""
    wheel = wheel_in(dists, "core_jobs_harness")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    assert top_level(wheel) == {"harness"}
    sources = {p.relative_to(ROOT).as_posix() for p in (ROOT / "harness").rglob("*.py")}
    assert {n for n in names if not n.split("/")[0].endswith(".dist-info")} == sources | {"harness/py.typed"}
    assert not [n for n in names if Path(n).stem in ("operations", "execution_views", "reconciliation", "keyset")]


def test_the_harness_declares_only_psycopg_pydantic_structlog_the_otel_api_and_three_extras(dists):
    """Its requirements: psycopg, pydantic, structlog, opentelemetry-api; prometheus-client only through the
    `metrics` extra, the OpenTelemetry SDK and exporter only through the `otel` extra, pika only through `rabbitmq`."""
    declared = metadata(wheel_in(dists, "core_jobs_harness"))
    assert sorted(declared["Requires-Dist"]) == [
        "opentelemetry-api>=1.27",
        "opentelemetry-exporter-otlp-proto-http>=1.27; extra == 'otel'",
        "opentelemetry-sdk>=1.27; extra == 'otel'",
        "pika>=1.3; extra == 'rabbitmq'",
        "prometheus-client>=0.20; extra == 'metrics'",
        "psycopg>=3.2",
        "pydantic>=2.7",
        "structlog>=24.1",
    ]
    assert declared["Provides-Extra"] == ["metrics", "otel", "rabbitmq"]


def test_the_core_jobs_wheel_ships_the_jobs_and_depends_on_the_harness_distribution(dists):
    """core-jobs's wheel has the two job families (maintenance, alerts) and migrations but not harness/, which it requires with metrics and rabbitmq."""
    wheel = wheel_in(dists, "core_jobs")
    assert top_level(wheel) == {"maintenance", "alerts", "migrations"}
    assert "core-jobs-harness[metrics,rabbitmq]" in metadata(wheel)["Requires-Dist"]


# What a production install must not carry: the demo (a distribution of its own, in the dev group) and the
# embedded PostgreSQL it starts. Names as a requirement or an exported line starts with them.
NOT_IN_PRODUCTION = ("core-jobs-demo", "core_jobs_demo", "pgserver", "-e ./demo")


def requirement_names(lines: list[str]) -> list[str]:
    """The lines that name a distribution (comments and continuation lines aside), lowercased."""
    return [line.strip().lower() for line in lines if line.strip() and not line.startswith(("#", " "))]


def test_the_core_jobs_wheel_holds_neither_the_demo_nor_the_embedded_postgres(dists):
    """core-jobs's wheel (what `pip install core-jobs` gets) has no demo module and requires neither the demo nor pgserver."""
    wheel = wheel_in(dists, "core_jobs")
    with zipfile.ZipFile(wheel) as archive:
        demo_files = [n for n in archive.namelist() if "demo" in n.split("/")[:-1] or n.startswith("core_jobs_demo")]
    assert demo_files == []
    required = requirement_names(metadata(wheel)["Requires-Dist"])
    assert [r for r in required if r.startswith(NOT_IN_PRODUCTION)] == []


def test_a_production_sync_installs_neither_the_demo_nor_the_embedded_postgres():
    """`uv export --no-dev` (the set `uv sync --no-dev`, the Dockerfile's install, would install) has neither; the dev set has both."""
    production = requirement_names(run(uv(), "export", "--frozen", "--no-dev", "--no-hashes").splitlines())
    development = requirement_names(run(uv(), "export", "--frozen", "--no-hashes").splitlines())
    assert [r for r in production if r.startswith(NOT_IN_PRODUCTION)] == []
    assert any(r.startswith("-e ./demo") for r in development)
    assert any(r.startswith("pgserver==") for r in development)


def test_the_harness_installed_alone_works_without_the_jobs_dependencies(dists, database_url, tmp_path):
    """In a fresh venv with only the harness wheel: every module imports, a job is handled, no jobs module is there."""
    venv = tmp_path / "venv"
    run(uv(), "venv", "--quiet", "--python", sys.executable, venv)
    python = venv / "bin" / "python"
    run(uv(), "pip", "install", "--quiet", "--python", python, wheel_in(dists, "core_jobs_harness"))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    checked = json.loads(run(python, "-c", STANDALONE_CHECK, database_url, *NOT_IN_A_CONSUMER, cwd=tmp_path, env=env))
    assert Path(checked["harness_file"]).is_relative_to(venv)  # the installed copy, not the repository's
    assert set(checked["modules"]) >= {
        "harness.consumer.consumer",
        "harness.handling",
        "harness.metrics",
        "harness.worker",
        "harness.queue.port",
        "harness.queue.pgqueue",
        "harness.examples.points",
    }
    assert checked["unresolved"] == []  # the façade's every public name, from the installed wheel
    assert checked["importable"] == []
    assert (checked["outcome"], checked["fences"]) == ("Acked", 1)
    assert "core-jobs-harness[metrics]" in checked["prometheus_error"]
    assert {"harness.testing", "harness.queue.rabbitmq"} <= set(checked["modules"])  # shipped, each needing its own
    assert checked["needs"] == {"harness.queue.rabbitmq": "pika", "harness.testing": "pytest"}


def test_the_image_compiles_bytecode_when_it_is_built():
    """The image compiles every module it runs — the locked install (UV_COMPILE_BYTECODE=1) and the standard library: the CLI's answer times rest on it.

    Its runtime filesystem is read-only and PYTHONDONTWRITEBYTECODE=1, so a module not compiled at build
    time is compiled from source by every process: check-config took twice as long that way (bench/cli.py).
    """
    dockerfile = (ROOT / "Dockerfile").read_text()
    builder = dockerfile.split("FROM ${PYTHON_IMAGE} AS builder", 1)[1].split("\nFROM ", 1)[0]
    assert "UV_COMPILE_BYTECODE=1" in builder
    assert "--no-editable" in builder  # an editable install would leave the project's own modules uncompiled
    runtime = dockerfile.rsplit("\nFROM ${PYTHON_IMAGE}\n", 1)[1]
    assert "python -m compileall" in runtime and "stdlib" in runtime  # the base image ships the library uncompiled
