"""What the RabbitMQ adapter's URL and topology mean, without pika: options, queue names, delays, the horizon.

:mod:`harness.queue.rabbitmq` talks to the broker (pika) and re-exports everything here. This
module imports no pika, so whoever only needs to *reason* about a RabbitMQ queue URL — the
bundle's ``core-jobs check-config`` and the TTL guard (J-B7), which must stay light and work
where the ``rabbitmq`` extra is not installed — reads it from here:

- :func:`url_options` splits a queue URL into pika's part and the adapter's own options
  (``delivery_limit``, ``prefix``, ``consumer_timeout`` ms, ``claim_wait`` ms), checked and typed,
  exactly as :meth:`RabbitQueue.from_url <harness.queue.rabbitmq.RabbitQueue.from_url>` does;
- :func:`redelivery_horizon` is how much longer than a retry policy's window a job may still be
  delivered by the broker; :func:`delivery_limit_problem` says why a delivery limit is too low
  for a policy;
- the delay buckets (:data:`BUCKETS_MS`, :func:`delay_bucket`) and the queue names
  (:func:`exhausted_queue_name`, :func:`delay_queue_name`).

:func:`redact_url` (the harness's one URL masker, harness/urls.py) writes a URL with its secrets as
``***``: what logs, errors and reprs show. :func:`url_options` refuses a URL whose host part no
parser can read (a port that is no number 1-65535, an unclosed IPv6 ``[``) before pika sees it,
naming the problem and showing the URL masked: Python's own messages would quote the "port",
which for an unencoded ``/`` or ``:`` in the password is part of it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from harness.consumer.retry import RetryPolicy, max_retry_window
from harness.queue.adapters import QueueUrlError
from harness.urls import redact_url

__all__ = [
    "BUCKETS_MS",
    "BUCKET_IDLE",
    "BUCKET_REDECLARE",
    "BUCKET_STRETCH",
    "DEFAULT_CLAIM_WAIT",
    "DEFAULT_CONSUMER_TIMEOUT",
    "DEFAULT_DELIVERY_LIMIT",
    "URL_OPTIONS",
    "broker_address",
    "delay_bucket",
    "delay_queue_name",
    "delivery_limit_problem",
    "exhausted_queue_name",
    "redact_url",
    "redelivery_horizon",
    "split_hosts",
    "url_options",
    "url_problem",
]

# Deliveries of one message the broker allows before it moves the message to `<q>.exhausted`: the last
# guard against a message that kills its consumer. Above any sane max_attempts, so the harness's own
# budget (harness/handling.py) ends such a loop first; this catches what never reaches the harness.
DEFAULT_DELIVERY_LIMIT = 20
# RabbitMQ's default consumer_timeout (rabbitmq.conf `consumer_timeout`, global in 3.10): the lease.
DEFAULT_CONSUMER_TIMEOUT = timedelta(minutes=30)
DEFAULT_CLAIM_WAIT = timedelta(milliseconds=50)

# Delay buckets: the R10 preferred numbers (each ≤ 28 % above the one before), in milliseconds.
_R10 = (100, 125, 160, 200, 250, 315, 400, 500, 630, 800)
_MAX_TTL_MS = 2**32 - 1  # RabbitMQ's largest x-message-ttl
BUCKETS_MS: tuple[int, ...] = tuple(
    m * 10**k for k in range(10) for m in _R10 if m * 10**k <= _MAX_TTL_MS
)  # 100 ms … 4 000 000 000 ms (46 days)
# A rounded delay is at most this factor of the delay asked for (delays of 100 ms and more).
BUCKET_STRETCH = max(b / a for a, b in itertools.pairwise(BUCKETS_MS))
# An unused bucket is deleted this long after its TTL (x-expires); publishers re-declare a bucket at
# least every BUCKET_REDECLARE, so a bucket holding a message never expires under it.
BUCKET_IDLE = timedelta(hours=1)
BUCKET_REDECLARE = timedelta(minutes=10)


def _at_least(least: int) -> Callable[[str], int]:
    def read(value: str) -> int:
        number = int(value)
        if number < least:
            raise ValueError(value)
        return number

    return read


def _milliseconds(least: int) -> Callable[[str], timedelta]:
    def read(value: str) -> timedelta:
        return timedelta(milliseconds=_at_least(least)(value))

    return read


# The adapter's own options in the URL's query string, each with how its text is read (ValueError: out of range,
# as RabbitQueue would refuse it); the rest is pika's.
URL_OPTIONS: dict[str, Callable[[str], Any]] = {
    "delivery_limit": _at_least(1),
    "prefix": str,
    "consumer_timeout": _milliseconds(1),  # ms
    "claim_wait": _milliseconds(0),  # ms
}


def url_options(url: str) -> tuple[str, dict[str, Any]]:
    """``url`` without the adapter's own options (what pika reads), and those options typed.

    QueueUrlError (a ValueError) naming the option and the URL with its password redacted when one does not read
    or is out of range (``delivery_limit=many``, ``delivery_limit=0``, ``consumer_timeout=0``), or
    when the URL's host part does not parse (:func:`url_problem`).
    """
    problem = url_problem(url)
    if problem is not None:
        raise QueueUrlError(f"{problem}: {redact_url(url)}")
    parts = urlsplit(url)
    ours: dict[str, str] = {}
    theirs: list[tuple[str, str]] = []
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name in URL_OPTIONS:
            ours[name] = value
        else:
            theirs.append((name, value))
    options: dict[str, Any] = {}
    for name, value in ours.items():
        try:
            options[name] = URL_OPTIONS[name](value)
        except ValueError:
            raise QueueUrlError(f"invalid {name}={value!r} in the queue URL {redact_url(url)}") from None
    return urlunsplit(parts._replace(query=urlencode(theirs))), options


def split_hosts(url: str) -> list[str]:
    """One URL per node of a multi-host queue URL, in its order; ``[url]`` when it names one host.

    ``amqp://user:password@h1:5701,h2:5702,h3:5703/vhost?options`` names a cluster's nodes: each
    URL is the same user, password, vhost and options with one ``host:port`` (the userinfo is
    read up to the last ``@`` of the authority, so a raw ``@`` or ``,`` in the password stays
    the password's). pika tries such a list in turn (harness/queue/rabbitmq.py).
    """
    scheme, separator, rest = url.partition("://")
    if not separator:
        return [url]
    authority = _authority(url)
    userinfo, at, hosts = authority.rpartition("@")
    if "," not in hosts:
        return [url]
    tail = rest[len(authority) :]
    return [f"{scheme}://{userinfo}{at}{host}{tail}" for host in hosts.split(",")]


def _authority(url: str) -> str:
    """What follows ``scheme://`` up to the path, the query or the fragment."""
    rest = url.partition("://")[2]
    return rest[: min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))]


def url_problem(url: str) -> str | None:
    """Why pika could not read ``url``'s host part — each host's, for a multi-host URL (:func:`split_hosts`) — (its
    own message, or Python's, would quote a piece of it); None: it can."""
    urls = split_hosts(url)
    if len(urls) > 1 and any(not _authority(one).rpartition("@")[2] for one in urls):
        return "the queue URL names an empty host between its commas"
    for one in urls:
        problem = _host_problem(one)
        if problem is not None:
            return problem
    return None


def _host_problem(url: str) -> str | None:
    try:
        parts = urlsplit(url)
    except ValueError:  # urllib's only complaint here: an IPv6 host's unclosed [ (or a stray ])
        return "the queue URL's IPv6 host has an unclosed [ (write it as [::1])"
    try:
        port = parts.port
    except ValueError:  # not a number, or above 65535
        port = 0
    if port == 0:
        return (
            "the queue URL's port is not a number 1-65535"
            " (a / : @ ? or # in its user name or password is written %2F %3A %40 %3F %23)"
        )
    return None


def broker_address(url: str) -> str:
    """``host:port`` of the broker a queue URL names, the port pika would use when it names none (5672; 5671 for
    amqps); a multi-host URL's every node, comma-separated."""
    return ",".join(_address(one) for one in split_hosts(url))


def _address(url: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or "localhost"
    try:
        port = parts.port
    except ValueError:  # not a number: pika refuses the URL; say where it points as written
        port = None
    if port is None:
        port = 5671 if parts.scheme.lower() == "amqps" else 5672
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def delay_bucket(delay: timedelta) -> int:
    """The delay bucket (ms) a ``delay`` waits in: the smallest one not shorter than it; 0 for no delay."""
    if delay <= timedelta(0):
        return 0
    wanted = math.ceil(delay / timedelta(milliseconds=1))
    for bucket in BUCKETS_MS:
        if bucket >= wanted:
            return bucket
    raise ValueError(f"a delay of {delay} is longer than RabbitMQ's largest message TTL ({BUCKETS_MS[-1]} ms)")


def delay_queue_name(work_queue: str, bucket_ms: int) -> str:
    """The broker queue holding ``work_queue``'s messages delayed by ``bucket_ms``."""
    return f"{work_queue}.delay.{bucket_ms}ms"


def exhausted_queue_name(work_queue: str) -> str:
    """Where the broker's delivery limit moves a message of ``work_queue``."""
    return f"{work_queue}.exhausted"


def redelivery_horizon(
    policy: RetryPolicy,
    *,
    consumer_timeout: timedelta = DEFAULT_CONSUMER_TIMEOUT,
    delivery_limit: int = DEFAULT_DELIVERY_LIMIT,
) -> timedelta:
    """How much longer than the policy's retry window a job may still be delivered on RabbitMQ.

    The TTL guard (J-B7) adds it to ``max_retry_window`` (``CORE_JOBS_BROKER_REDELIVERY_HORIZON``):

    - bucket rounding: every delay may wait up to :data:`BUCKET_STRETCH` − 1 (28 %) longer, plus
      100 ms per retry for the smallest bucket;
    - the consumer timeout: each of the ``max_attempts`` deliveries may be held a whole
      ``consumer_timeout`` before it settles or comes back, and a delivery that never settles
      comes back up to ``delivery_limit`` times more, then once from ``<q>.exhausted``.

    With the defaults (5 attempts, window 11 min 12 s, 30 min, limit 20): 13 h 3 min 9 s.
    """
    rounding = max_retry_window(policy) * (BUCKET_STRETCH - 1) + timedelta(milliseconds=100) * policy.max_retries
    held = consumer_timeout * (policy.max_attempts + delivery_limit + 1)
    return timedelta(seconds=math.ceil((rounding + held).total_seconds()))


def delivery_limit_problem(
    delivery_limit: int, policy: RetryPolicy, *, policy_name: str = "the retry policy"
) -> str | None:
    """Why ``delivery_limit`` is too low for ``policy`` (named ``policy_name``); None when it is above ``max_attempts``.

    The harness's own budget must end a crash loop: a message that kills its consumer comes back
    counted (``x-delivery-count``) and, beyond ``max_attempts``, is dead-lettered unrun
    (harness/handling.py). A delivery limit at or under ``max_attempts`` lets the broker move the
    message to ``<q>.exhausted`` while the policy still had attempts to give it — the limit would
    shorten the policy, silently, for exactly the messages whose workers die.
    """
    if delivery_limit > policy.max_attempts:
        return None
    return (
        f"delivery_limit={delivery_limit} is not above max_attempts={policy.max_attempts} of {policy_name}:"
        f" the broker would give up on a message whose worker keeps dying before the retry policy does;"
        f" set delivery_limit to at least {policy.max_attempts + 1}"
    )
