"""A queue URL naming a RabbitMQ cluster's every node (``amqp://user:password@h1:5701,h2:5702,h3:5703/vhost``): read as
one URL per node, in order, each with the same user, password, vhost and options; shown with its password masked."""

from __future__ import annotations

import psycopg
import pytest

from harness.queue.adapters import QueueUrlError
from harness.queue.rabbitmq import RabbitQueue
from harness.queue.rabbitmq_topology import broker_address, split_hosts, url_options, url_problem

pytestmark = pytest.mark.pure

CLUSTER = "amqp://app:S3cret@h1:5701,h2:5702,h3:5703/vh?heartbeat=30"


def test_a_multi_host_url_is_one_url_per_node_in_order_with_the_same_credentials_vhost_and_options():
    assert split_hosts(CLUSTER) == [
        "amqp://app:S3cret@h1:5701/vh?heartbeat=30",
        "amqp://app:S3cret@h2:5702/vh?heartbeat=30",
        "amqp://app:S3cret@h3:5703/vh?heartbeat=30",
    ]


def test_a_single_host_url_and_a_comma_in_the_password_are_one_node():
    assert split_hosts("amqp://app:pw@rabbit:5672/vh") == ["amqp://app:pw@rabbit:5672/vh"]
    assert split_hosts("amqp://app:p,w@rabbit/vh") == ["amqp://app:p,w@rabbit/vh"]


def test_the_broker_address_of_a_multi_host_url_names_every_node():
    assert broker_address(CLUSTER) == "h1:5701,h2:5702,h3:5703"
    assert broker_address("amqp://app:pw@h1,[::1]:5701/vh") == "h1:5672,[::1]:5701"


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("amqp://app:S3cret@h1:5701,,h3:5703/vh", "empty host"),
        ("amqp://app:S3cret@h1:5701,h2:99999/vh", "port is not a number"),
    ],
)
def test_a_multi_host_url_with_a_node_pika_cannot_read_is_refused_naming_why_never_the_password(url, problem):
    assert problem in (url_problem(url) or "")
    with pytest.raises(QueueUrlError, match=problem) as raised:
        url_options(url)
    assert "S3cret" not in str(raised.value)


def test_the_adapter_given_a_cluster_tries_every_node_and_shows_none_of_its_password():
    conn = psycopg.Connection.__new__(psycopg.Connection)  # never used: nothing connects before a publish or a claim
    port = RabbitQueue.from_url(f"{CLUSTER}&delivery_limit=7", conn, worker="w")
    assert [(p.host, p.port, p.heartbeat) for p in port._parameters] == [
        ("h1", 5701, 30),
        ("h2", 5702, 30),
        ("h3", 5703, 30),
    ]
    assert port.address == "h1:5701,h2:5702,h3:5703"
    assert "S3cret" not in repr(port) and port.url == "amqp://app:***@h1:5701,h2:5702,h3:5703/vh?heartbeat=30"
