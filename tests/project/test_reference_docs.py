"""The generated references in docs/reference/ are what the code says today (no database)."""

from __future__ import annotations

import pytest

from tools import reference

pytestmark = pytest.mark.pure


@pytest.mark.parametrize("page", sorted(reference.PAGES), ids=lambda p: p.name)
def test_generated_reference_page_is_up_to_date(page):
    """The committed page equals what `python -m tools.reference` writes; regenerate when not."""
    assert page.exists(), f"{page} is missing: run `uv run python -m tools.reference`"
    assert page.read_text() == reference.PAGES[page](), (
        f"{page.relative_to(reference.ROOT)} is stale: run `uv run python -m tools.reference` and commit it"
    )


def test_settings_page_lists_every_setting_with_its_default():
    """Each Settings field is a row of the settings page, with its variable name and default."""
    from maintenance.settings import ENV_PREFIX, Settings

    page = reference.render_settings()
    for name in Settings.model_fields:
        assert f"| `{ENV_PREFIX}{name.upper()}` |" in page
    assert "| `CORE_JOBS_RETRY_MAX_ATTEMPTS` | integer | `5` |" in page


def test_events_page_has_each_jobs_stop_event_with_its_result_fields():
    """A job's stop event is listed with the keys of its result (here the purge's num_deleted)."""
    events = reference.collect_events()
    assert "num_deleted" in events["maintenance.purge.stop"].fields
    assert {"job", "ok", "duration_s"} <= events["maintenance.purge.stop"].fields
    assert "error" in events["maintenance.purge.error"].fields


def test_source_scan_finds_events_named_through_module_constants(tmp_path):
    """An f-string event name built from a module constant resolves; a dynamic one is skipped."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "mod.py").write_text(
        'EVENTS = "pkg.job"\n'
        "def f(log, x):\n"
        '    log.info(f"{EVENTS}.done", rows=1, **x)\n'
        '    log.warning(f"{x}.dynamic")\n'
        '    log.error("not an event name")\n'
    )
    found = list(reference.source_events(tmp_path, ("pkg",)))
    assert found == [("pkg.job.done", {"rows", reference.SPREAD}, "pkg/mod.py")]


def test_events_page_lists_the_schedulers_missed_and_skipped_runs():
    """`core-jobs serve`'s maintenance.scheduler.missed and .skipped warnings are on the events page, with their fields."""
    events = reference.collect_events()
    for name in ("maintenance.scheduler.missed", "maintenance.scheduler.skipped"):
        assert name in events, f"{name} is logged but missing from docs/reference/events.md"
        assert {"scheduled_at", "reason"} <= events[name].fields


def test_every_log_call_names_its_event_where_the_scan_can_read_it():
    """Outside the runner (whose job events come from the specs), no logger call names its event through a variable."""
    unreadable = [
        place for place in reference.unreadable_log_calls() if not place.startswith("maintenance/service/runner.py:")
    ]
    assert unreadable == [], f"event names the events page cannot list: {unreadable}"


@pytest.mark.parametrize("job", ["purge", "alerts", "metrics"])
def test_each_jobs_manual_lists_exactly_the_settings_its_package_declares(job):
    """docs/<job>.md's generated block has one row per field of its package's settings.py, and no other."""
    from maintenance.jobs.catalog import PACKAGES, by_name
    from maintenance.settings import ENV_PREFIX

    text = reference.manual_page(job).read_text()
    source = PACKAGES[job].replace(".", "/") + "/settings.py"
    block = text.split(reference.OPTIONS_BEGIN.format(source=source))[1]
    block = block.split(reference.OPTIONS_END)[0]
    listed = [line.split("`")[1] for line in block.splitlines() if line.startswith("| `")]
    declared = by_name()[job].settings
    assert listed == [ENV_PREFIX + name.upper() for name in declared.model_fields]


def test_metrics_page_lists_every_exported_family_with_its_labels():
    """The metrics page has each job's declared result gauges, the worker's new series and the API's, each with its labels, and no core_jobs_job_result."""
    from maintenance.jobs.catalog import JOBS

    families = {f.name: f for f in reference.collect_metrics()}
    for spec in JOBS:
        for metric in spec.result_metrics:
            assert families[metric.name].labels == ("job_name",)
    assert families["harness_handler_duration_seconds"].type == "histogram"
    assert families["harness_queue_depth"].labels == ("queue",)
    assert families["harness_leases_lost_total"].labels == ("consumer",)
    assert families["core_jobs_api_requests_total"].labels == ("method", "route", "status")
    assert families["core_jobs_executions"].labels == ("consumer", "status")
    assert "core_jobs_job_result" not in families
