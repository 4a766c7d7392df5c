"""The queue: the port a broker adapter implements (``port``) and the reference PostgreSQL adapter (``pgqueue``).

The worker and the handling speak only to the port — ``QueuePort``, ``Envelope``, ``Delivery``
and the outcomes that ``settle()`` applies; ``pgqueue`` is the one adapter shipped (leases with
fencing tokens, ``FOR UPDATE SKIP LOCKED`` claims). ``relay`` moves what the operations layer publishes
in ``core.queue_messages`` — the outbox of a queue that lives on a broker — onto that broker.
docs/harness.md, docs/outbox.md.
"""
