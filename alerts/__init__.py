"""The alerts job: Better Stack incidents for items that need a person, escalations for stale
ones, and auto-resolve once they are handled — each exactly once, across crashes and overlapping runs.

Why it is built this way: every failure must reach a person (J-B4), once, and one left unreviewed
must escalate (J-Q2). A page can be lost between Better Stack accepting it and the database
recording it, so each incident is recorded as an *intent* with a deterministic key before it is
posted, and an intent left over is looked up by that key before anything is posted again; the
key carries this installation's identity, so databases sharing one Better Stack team — or a copy
of a database — never take each other's incidents. The items' own tables are never written.

The vocabulary, as the code names it: the job pages about **items** of two sources (sources.py)
— dead letters pending review, grouped by queue; executions left RECONCILIATION_REQUIRED, one
*episode* each, grouped by consumer — and an incident covers the items of one **key**. An item
is *pending* while it is in that state, and *stale* once pending longer than ``stale_after``.

The operator's manual — what one run does, the installation identity and copied databases, the
incident texts, the heartbeat, the options (generated from settings.py), the result, the events
and the failure modes — is docs/alerts.md, written once there.
"""

# The parts: settings.py (its settings, declared once: the feed's configuration), sql.py (the
# named SQL, one section per source), sources.py (what differs between the two sources),
# incidents.py (scan, group, cap, compose the text),
# identity.py (the installation's identity), feed.py (the run, AlertFeedResult, and SPEC),
# betterstack.py (the Better Stack client), heartbeat.py (the dead-man's switch every run pings)
# and cli.py (`core-jobs alerts ...`). A module's path is its event namespace: alerts.feed.*,
# alerts.identity.*, alerts.betterstack.*, alerts.heartbeat.*. This package imports only the
# platform (maintenance.jobs.base, .operations, .fields, .runtime, .errors) and the harness;
# only the composition root (the job catalog, the settings, the CLI's parser) names it.
