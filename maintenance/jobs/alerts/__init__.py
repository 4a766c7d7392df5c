"""The alerts job: Better Stack incidents for items that need a person, escalations for stale
ones, and auto-resolve once they are handled — each exactly once, across crashes and overlapping runs.

``core-jobs run-once alerts`` pages about two sources of **items** (sources.py), each grouped by
a **key**; without ``CORE_JOBS_BETTERSTACK_API_TOKEN`` it runs dry.

- **dead letters** pending review (``pending_review``), grouped by queue;
- **executions** left RECONCILIATION_REQUIRED — one *episode* each, a stay in that state
  (execution_sql.py) — grouped by consumer.

An item is *pending* while it is in that state, and *stale* once it has been pending longer than
``stale_after``. The parts: config.py (options, and the mapping from the settings), sql.py and
execution_sql.py (the named SQL of each source), sources.py (what differs between the two),
incidents.py (scan, group, cap, compose the text), identity.py (the installation's identity), job.py
(the run, its result and SPEC); the Better Stack client is an integration
(``maintenance/integrations/betterstack/``).

What one run does (``run_once(now)``; ``now`` is PostgreSQL's clock, read once by the caller)
--------------------------------------------------------------------------------------------
1. Takes the advisory lock ``core_jobs.alerts``. If another runner holds it, the run is
   skipped (``alerts.feed.skipped``, ``skipped=1``): one runner at a time.
2. **Earlier intents first** (see 6): each intent an earlier run left ``pending`` is looked up
   at Better Stack; found → ``open``; absent and moot → **cancelled**, never posted:
   ``handled`` when all its items were handled meanwhile (no page about nothing), or
   ``superseded`` when it is a first-page intent one of whose pending items is stale now.
   A cancelled intent releases its items still pending, and the scan below plans them
   again: the stale ones into the escalation, the fresh ones into a new incident — each item
   is paged once, and none is left out. The database knows the state (``pending →
   open → resolved``, ``pending → cancelled``) and allows deleting only a cancelled alert's
   coverage.
3. **New items** (pending, younger than ``stale_after``, not yet covered by an alert) → one
   incident **per key**, e.g. ``12 new dead letters in points.credit`` or ``2 executions of
   points.ledger need reconciliation``, with the time range, the most frequent reasons
   (``last_error``; an execution's ``reason``) with counts, sample ``job_id`` /
   ``correlation_id`` and, for a queue, a link from ``ops_url_template``; routed with
   ``policy_id``.
4. **Stale items** (still pending at ``now − stale_after``, not yet escalated) → one escalation
   incident per key, routed with ``escalation_policy_id``. An item that was never alerted
   because it was already stale when first seen is covered by the escalation alone (one page,
   not two).
5. **Storms**: at most ``max_incidents_per_run`` incidents per kind; the smallest groups beyond
   that are folded into one summary incident (``312 new dead letters in 281 queues``).
   Nothing is dropped.
6. **Exactly once**: each incident is first recorded as an *intent* (``state='pending'``) with
   a deterministic ``alert_key`` (this installation's id + kind + the items it covers)
   and its coverage rows, in one transaction; then POSTed with the key and the installation id
   in its ``metadata`` (``core_jobs_alert_key``, ``core_jobs_installation``); only a ``201``
   with ``data.id`` moves it to ``open``. An intent left ``pending`` by an earlier run (crash
   between POST and record, or Better Stack down) is first looked up by that metadata (2):
   found → recorded, not posted again; absent → posted, unless cancelled. A lookup adopts an
   incident only when its metadata has both our key and our installation id, so databases
   sharing one Better Stack team never take each other's incidents. The items' own tables are
   never written.

   **The installation** (``core.installation``, migration ``0006_alert_identity``) is one row
   with a random UUID made by the migration, read once per run; the database refuses to change
   it but by a rebind. ``downgrade base`` + ``migrate`` makes a new one, so incidents of the
   database's earlier life (same ids) are never adopted. It is bound to where the database lives
   (cluster system identifier, database oid; migration ``0015_installation_copies``): a copy
   (restored dump, ``CREATE DATABASE … TEMPLATE``) that has alerts refuses to run until an
   operator adopts or renews it; one that never alerted takes a new identity by itself. It is
   bound to the deployment's environment too (``CORE_JOBS_ALERTS_ENVIRONMENT``, migration
   ``0016_installation_environment``): a physical copy run as another environment is treated the
   same way; the first environment given to an installation with none is recorded by itself
   (identity.py).
7. **Auto-resolve**: an ``open`` incident none of whose items is still pending is
   resolved at Better Stack (``409`` already resolved counts as done) and marked ``resolved``
   (``resolution='resolved'``). A ``404`` means someone deleted the incident there: once the
   incident list confirms it (it answers, without that incident — a wrong API URL answers 404
   to everything and stays a failure), the alert is marked ``resolved`` with
   ``resolution='gone'`` (``alerts.feed.incident_gone``) and the run moves on.
8. After the first failure that says Better Stack is unreachable (or refuses the token), the
   rest is left for the next run (this run's intents are still recorded); a ``4xx`` about one
   incident's content skips only that one.

Without a Better Stack client (no token) the run is **dry**: it logs each incident it would post
(``alerts.feed.dry_run_incident`` with ``name`` and ``summary``) and writes nothing, so that
configuring a token later still alerts everything.

Options (:class:`~maintenance.jobs.alerts.config.AlertFeedConfig`)
----------------------------------
- ``stale_after``           duration, default 3 days: a pending item older than this escalates.
- ``max_incidents_per_run`` count ≥ 1, default 20: incidents per run and kind before folding.
- ``policy_id``             Better Stack escalation policy of new-dead-letter incidents; default none.
- ``escalation_policy_id``  policy of escalations; default none (then ``policy_id``).
- ``requester_email``       ``requester_email`` of incidents and ``resolved_by``; default none.
- ``ops_url_template``      link with ``{queue}``, e.g. ``https://ops.example/dead-letters?queue={queue}``.
- ``top_errors``            count, default 3: most frequent errors listed per incident.
- ``samples``               count, default 3: sample ``job_id`` / ``correlation_id`` per incident.

Result (fixed keys, all numbers; the runner logs them in ``alerts.feed.stop``)
------------------------------------------------------------------------------
``incidents_posted``, ``escalations_posted``, ``incidents_recovered`` (found by metadata instead
of confirmed by our POST: after a crash, or by the lookup after a retried POST),
``incidents_resolved``, ``incidents_gone`` (deleted at Better Stack, recorded ``gone``),
``intents_cancelled`` (``handled`` or ``superseded``, never posted), ``dead_letters_alerted``
(covered by incidents confirmed this run), ``dead_letters_unalerted`` (pending, not covered by a
confirmed incident), ``dead_letters_unescalated`` (stale, not covered by a confirmed
escalation), ``executions_alerted``, ``executions_unalerted``, ``executions_unescalated`` (the
same three for executions), ``post_failures`` (intents still unconfirmed after the run),
``resolve_failures``,
``skipped``, ``dry_run``, ``dry_run_incidents``. ``ok`` is false when anything could not be
posted or resolved.

Events (an item's key is their field ``queue``, its count ``num_dead_letters``, for both
sources, as in the alert table's columns): ``alerts.identity.unconfirmed`` (error: the run refuses), ``alerts.identity.renewed``
(warning), ``alerts.identity.declared`` (warning: the first environment recorded), ``alerts.feed.skipped``, ``alerts.feed.intent_recorded``, ``alerts.feed.intent_cancelled``
(``reason``, ``released``), ``alerts.feed.incident_posted``, ``alerts.feed.escalation_posted``,
``alerts.feed.incident_recovered``, ``alerts.feed.post_failed``, ``alerts.feed.incident_resolved``,
``alerts.feed.incident_gone`` (warning), ``alerts.feed.resolve_failed``,
``alerts.feed.dry_run_incident``, ``alerts.feed.dry_run_resolve``.
"""
