"""Durable execution: a consumer's external calls as actions, each checkpointed by its effect class.

The contract is docs/durable-actions.md. The parts, in the order a delivery meets them:

- :mod:`harness.consumer.actions` — what a consumer declares: ``Action``, its ``ActionContext``;
- :mod:`harness.consumer.effects` — ``Effect`` and ``RULES``, one entry of rules per effect class;
- :mod:`harness.durable.executor` — one delivery of a durable consumer, by phase:
  :mod:`harness.durable.take`, :mod:`harness.durable.run`, :mod:`harness.durable.settle`,
  :mod:`harness.durable.finish` (under the fence by :func:`harness.fence.work_under_fence`),
  sharing :mod:`harness.durable.state`; :mod:`harness.durable.decide` is the failure table;
- :mod:`harness.durable.sql` — its statements, written out whole;
- :mod:`harness.durable.window` — the crash-loop bound and the fence's window (J-B7);
- :mod:`harness.pipelined` — transactions whose BEGIN travels with their first statements.

Nothing is imported here: :mod:`harness.consumer.consumer` imports the actions, and the executor imports
the consumer.
"""
