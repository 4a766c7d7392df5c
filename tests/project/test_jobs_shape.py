"""Every scheduled job has the same parts (maintenance/jobs/__init__.py), checked for each job in JOBS."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect

import pytest
from support import ROOT

from maintenance.fields.crontab import check_crontab
from maintenance.jobs.catalog import CATALOG, JOBS, PACKAGES, by_name
from maintenance.settings import Settings

pytestmark = pytest.mark.pure

JOB_NAMES = [spec.name for spec in JOBS]
# A package docstring says why and points at the manual; past this many lines it is a second manual.
SUMMARY_MAX_LINES = 30


def test_jobs_run_in_the_documented_order():
    """`run-once` with no job named runs purge, then alerts, then metrics."""
    assert JOB_NAMES == ["purge", "alerts", "metrics"]
    assert list(by_name()) == JOB_NAMES


@pytest.mark.parametrize("spec", JOBS, ids=JOB_NAMES)
def test_each_job_package_has_its_manual_and_its_spec_module(spec):
    """The job's package (maintenance/jobs/<job>/, or alerts/) has a docstring that points at its manual docs/<job>.md, and its catalog line names the module of its SPEC inside it."""
    package = importlib.import_module(PACKAGES[spec.name])
    assert package.__doc__ and f"docs/{spec.name}.md" in package.__doc__, "the package docstring points at the manual"
    assert (ROOT / "docs" / f"{spec.name}.md").exists()
    (module,) = [module for name, module, _ in CATALOG if name == spec.name]
    assert module.startswith(f"{package.__name__}.")
    assert importlib.import_module(module).SPEC is spec


@pytest.mark.parametrize("spec", JOBS, ids=JOB_NAMES)
def test_each_job_is_built_from_its_settings_and_the_job_env_with_no_config_module(spec):
    """``build(settings, env)``: the job's settings mixin is its configuration (no config.py copies it), the JobEnv
    what every job shares."""
    assert list(inspect.signature(spec.build).parameters)[:2] == ["settings", "env"]
    package = importlib.import_module(PACKAGES[spec.name])
    assert not (ROOT / package.__name__.replace(".", "/") / "config.py").exists()


def test_the_jobs_base_imports_nothing_of_the_settings():
    """maintenance/jobs/base.py names no maintenance.settings, not even for typing: the circle
    base -> settings -> catalog -> base is gone, not hidden under TYPE_CHECKING."""
    tree = ast.parse((ROOT / "maintenance" / "jobs" / "base.py").read_text())
    imported = [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    imported += [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    assert [name for name in imported if name and name.startswith("maintenance.settings")] == []


@pytest.mark.parametrize("spec", JOBS, ids=JOB_NAMES)
def test_each_job_declares_its_settings_once_in_its_package_and_settings_composes_them(spec):
    """The spec's settings mixin is its package's settings.py's, declares schedule_<job>, and every field of it is a Settings field with the same default."""
    assert spec.settings is not None and spec.settings.__module__ == f"{PACKAGES[spec.name]}.settings"
    assert f"schedule_{spec.name}" in spec.settings.model_fields
    for name, info in spec.settings.model_fields.items():
        assert Settings.model_fields[name].default == info.default, name


@pytest.mark.parametrize("spec", JOBS, ids=JOB_NAMES)
def test_each_jobs_default_schedule_is_declared_once_in_its_settings(spec):
    """CORE_JOBS_SCHEDULE_<JOB>'s default, declared by the job's settings mixin alone (the spec carries none), is a
    crontab `serve` accepts."""
    default = Settings.model_fields[f"schedule_{spec.name}"].default
    assert check_crontab(default) == default
    assert not hasattr(spec, "schedule")


def a_result_of(job: str):
    """A result of ``job`` as its run_once returns it (nothing done), whose fields() are its stop event's."""
    if job == "metrics":
        from maintenance.jobs.metrics.job import NEVER, MetricsResult

        return MetricsResult(counted_from=NEVER, counted_until=NEVER, horizon="settle", now=NEVER)
    module, name = {
        "purge": ("maintenance.jobs.purge.job", "PurgeResult"),
        "alerts": ("alerts.feed", "AlertFeedResult"),
    }[job]
    return getattr(importlib.import_module(module), name)()


@pytest.mark.parametrize("spec", JOBS, ids=JOB_NAMES)
def test_each_jobs_error_event_has_the_stop_events_result_keys(spec):
    """zero_fields() (the .error event's fields) has exactly the keys of the result's fields() (the .stop event's), all 0."""
    zero = spec.zero_fields()
    assert list(zero) == list(a_result_of(spec.name).fields())
    assert all(v == 0 and not isinstance(v, bool) for v in zero.values()), zero


@pytest.mark.parametrize(
    ("result_class", "not_event_fields"),
    [
        ("maintenance.jobs.purge.job:PurgeResult", {"cutoff", "protected_from"}),
        ("alerts.feed:AlertFeedResult", {"planned"}),
    ],
)
def test_result_names_every_counter_as_an_event_field(result_class, not_event_fields):
    """Each dataclass field of a result is either in its explicit EVENT_FIELDS or one of its named non-event fields."""
    module, name = result_class.split(":")
    cls = getattr(importlib.import_module(module), name)
    declared = {f.name for f in dataclasses.fields(cls)}
    assert set(cls.EVENT_FIELDS) | not_event_fields == declared
    assert list(cls().fields()) == list(cls.EVENT_FIELDS)


@pytest.mark.parametrize("spec", JOBS, ids=JOB_NAMES)
def test_each_jobs_manual_is_written_once_in_docs_not_again_in_its_docstring(spec):
    """The package docstring of the job's package is at most 30 lines: the why and a pointer, not a second manual."""
    package = importlib.import_module(PACKAGES[spec.name])
    lines = len((package.__doc__ or "").strip().splitlines())
    assert lines <= SUMMARY_MAX_LINES, (
        f"{package.__name__}'s docstring is {lines} lines: move the detail to docs/{spec.name}.md"
    )


@pytest.mark.parametrize("spec", JOBS, ids=JOB_NAMES)
def test_each_result_metric_reads_a_stop_event_field_and_is_named_in_base_units(spec):
    """Every metric a job declares from its result reads one of its stop event's fields and is named core_jobs_<job>_<quantity> without a millisecond unit."""
    fields = spec.zero_fields()
    for metric in spec.result_metrics:
        assert metric.field in fields, f"{metric.name} reads {metric.field}, not a field of {spec.events}.stop"
        assert metric.name.startswith(f"core_jobs_{spec.name}_"), metric.name
        assert not metric.name.endswith(("_ms", "_milliseconds", "_total")), metric.name


def test_the_contracted_result_metrics_are_declared():
    """purge and alerts declare exactly the per-quantity gauges operators chart; the metrics job declares none (its families are its own)."""
    declared = {spec.name: {m.name for m in spec.result_metrics} for spec in JOBS}
    assert declared == {
        "purge": {
            "core_jobs_purge_rows_deleted",
            "core_jobs_purge_rows_left",
            "core_jobs_purge_longest_batch_seconds",
            "core_jobs_purge_batches",
        },
        "alerts": {
            "core_jobs_alerts_incidents_opened",
            "core_jobs_alerts_incidents_resolved",
            "core_jobs_alerts_escalations",
            "core_jobs_alerts_dry_run",
        },
        "metrics": set(),
    }
