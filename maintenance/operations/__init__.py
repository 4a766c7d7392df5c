"""The operator's side of the harness's tables: what the CLI and the API both call, the same functions.

- ``dead_letters`` — list, replay, discard, release, audited in ``core.dead_letter_actions``;
- ``executions`` — read-only views of durable executions (pages by state, the detail);
- ``resolution`` — an operator's statement that resolves an execution in
  ``RECONCILIATION_REQUIRED`` (R-5, R-6);
- ``keyset`` — the keyset paging both lists share;
- ``stored`` — how a stored JSON value Python cannot decode is shown (its text and why);
- ``limits`` — the caps the settings default to (imports nothing, so the settings load no psycopg).

A consumer service never imports these: they ship with the bundle, not with the harness's
wheel. A refusal (``OperationRefused``, ``ResolutionRefused``) says what is wrong in words that
fit any surface; the CLI and the API each say how to fix it in their own terms.
"""
