"""The queue: the port a broker adapter implements (``port``), the reference PostgreSQL adapter (``pgqueue``), and
the choice of an adapter from a URL (``adapters``).

The worker and the handling speak only to the port — ``QueuePort``, ``Envelope``, ``Delivery``
and the outcomes that ``settle()`` applies. ``pgqueue`` is the reference adapter (leases with
fencing tokens, ``FOR UPDATE SKIP LOCKED`` claims); ``adapters.open_queue`` opens it, RabbitMQ's
(``rabbitmq``, imported only when an ``amqp://`` URL chooses it) or a third party's registered
under its URL scheme. ``relay`` moves what the operations layer publishes in
``core.queue_messages`` — the outbox of a queue that lives on a broker — onto that broker.
docs/harness.md ("Choosing the queue"), docs/outbox.md.
"""
