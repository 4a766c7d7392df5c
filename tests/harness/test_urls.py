"""The one URL masker (harness/urls.py): a corpus of odd URLs and conninfo strings, each secret hidden, nothing else lost."""

from __future__ import annotations

import pytest

from harness.urls import redact_url, url_secrets

pytestmark = pytest.mark.pure

# (written, shown): every secret in these corpora contains "S3cret"; what an operator needs (user, host, port,
# vhost or database, the other options) is kept as written.
CORPUS = {
    "a raw @ in the user name": ("amqp://svc@team:Pw-S3cret@rabbit:5672/vh", "amqp://svc@team:***@rabbit:5672/vh"),
    "a raw @ in the password": ("amqp://app:p@ss-S3cret@rabbit/vh", "amqp://app:***@rabbit/vh"),
    "a raw @ in both": ("amqp://a@b:p@ss@S3cret@rabbit/vh", "amqp://a@b:***@rabbit/vh"),
    "a : in the password": ("amqp://app:pa:ss-S3cret@rabbit:5672/vh", "amqp://app:***@rabbit:5672/vh"),
    "a / in the password": ("amqp://app:pa/ss-S3cret@rabbit/vh", "amqp://app:***@rabbit/vh"),
    "a ? in the password": ("amqp://app:pa?ss-S3cret@rabbit/vh", "amqp://app:***@rabbit/vh"),
    "a # in the password": ("amqp://app:pa#ss-S3cret@rabbit/vh", "amqp://app:***@rabbit/vh"),
    "percent-encoded parts": ("amqp://sv%40c:p%40ss-S3cret@rabbit/%2F", "amqp://sv%40c:***@rabbit/%2F"),
    "a cluster's every node": (
        "amqp://app:S3cret-pw@h1:5701,h2:5702,h3:5703/vh?heartbeat=30",
        "amqp://app:***@h1:5701,h2:5702,h3:5703/vh?heartbeat=30",
    ),
    "a cluster's nodes, a raw @ and , in the password": (
        "amqp://app:p@s,s-S3cret@h1:5701,h2:5702/vh",
        "amqp://app:***@h1:5701,h2:5702/vh",
    ),
    "node URLs listed, a password each": (
        "amqp://a:S3cret-1@h1:5701/vh,amqp://b:S3cret-2@h2:5702/vh",
        "amqp://a:***@h1:5701/vh,amqp://b:***@h2:5702/vh",
    ),
    "no password": ("amqp://app@rabbit:5672/vh", "amqp://app@rabbit:5672/vh"),
    "an empty password": ("amqp://app:@rabbit/vh", "amqp://app:@rabbit/vh"),
    "no user": ("amqp://rabbit:5672/%2F?heartbeat=30", "amqp://rabbit:5672/%2F?heartbeat=30"),
    "an IPv6 host": ("amqp://app:S3cret-pw@[::1]:5672/vh", "amqp://app:***@[::1]:5672/vh"),
    "an IPv6 host, no user, an @ in the query": (
        "amqp://[fe80::1%25eth0]:5672/vh?client=a@b",
        "amqp://[fe80::1%25eth0]:5672/vh?client=a@b",
    ),
    "?password=": (
        "postgresql://u@h/db?sslmode=require&password=S3cret-pw&application_name=x",
        "postgresql://u@h/db?sslmode=require&password=***&application_name=x",
    ),
    "?sslpassword=": (
        "postgresql://u@h/db?sslkey=/k.pem&sslpassword=S3cret-key",
        "postgresql://u@h/db?sslkey=/k.pem&sslpassword=***",
    ),
    "?PASSWORD= in upper case": ("postgresql://u@h/db?PASSWORD=S3cret-pw", "postgresql://u@h/db?PASSWORD=***"),
    "a password in both places": (
        "postgresql://u:S3cret-1@h/db?password=S3cret-2",
        "postgresql://u:***@h/db?password=***",
    ),
    "amqp ssl_options with a key password, encoded": (
        "amqps://u@rabbit/vh?ssl_options=%7B%27keyfile%27%3A+%27%2Fk.pem%27%2C+%27password%27%3A+%27S3cret-key%27%7D"
        "&heartbeat=30",
        "amqps://u@rabbit/vh?ssl_options=%7B%27keyfile%27%3A%20%27%2Fk.pem%27%2C%20%27password%27%3A%20%27***%27%7D"
        "&heartbeat=30",
    ),
    "amqp ssl_options with a key password, raw": (
        "amqps://u@rabbit/vh?ssl_options={'password':'S3cret-key','certfile':'/c.pem'}",
        "amqps://u@rabbit/vh?ssl_options=%7B%27password%27%3A%27***%27%2C%27certfile%27%3A%27%2Fc.pem%27%7D",
    ),
    "a multi-host libpq URL": (
        "postgresql://u:S3cret-pw@h1:5432,h2:5433/db?target_session_attrs=read-write",
        "postgresql://u:***@h1:5432,h2:5433/db?target_session_attrs=read-write",
    ),
    "a conninfo string": (
        "host=db port=5432 user=app password=S3cret-pw dbname=core",
        "host=db port=5432 user=app password=*** dbname=core",
    ),
    "a conninfo string, quoted values and spaces around =": (
        "host=db password = 'S3cret pw \\' S3cret' sslpassword=S3cret-key dbname='core'",
        "host=db password = *** sslpassword=*** dbname='core'",
    ),
    "a bad port": ("amqp://app:S3cret-pw@rabbit:notaport/vh", "amqp://app:***@rabbit:notaport/vh"),
    "a port out of range": ("postgresql://u:S3cret-pw@h:99999/db", "postgresql://u:***@h:99999/db"),
    "an unbalanced [": ("amqp://app:S3cret-pw@[::1/vh", "amqp://app:***@[::1/vh"),
    "an unbalanced [ and a raw @ in the user": ("amqp://a@b:S3cret-pw@[::1:5672/vh", "amqp://a@b:***@[::1:5672/vh"),
    "no host: what follows user: is no port": ("amqp://u:S3cret-pw/vh", "amqp://u:***/vh"),
    "no host nor path": ("amqp://u:S3cret-pw", "amqp://u:***"),
    "no host, a query": ("amqp://u:S3cret-pw?heartbeat=30", "amqp://u:***?heartbeat=30"),
    "a space in the password": ("amqp://app:pa ss-S3cret@rabbit/vh", "amqp://app:***@rabbit/vh"),
    "spaces in the password, no host": ("amqp://app:pa S3cret/vh", "amqp://app:***/vh"),
    "a password over 1024 characters": (f"amqp://app:{'S3cret' * 200}@rabbit:5672/vh", "amqp://app:***@rabbit:5672/vh"),
    "a password over 1024 characters, a raw @ in it": (
        f"amqp://app:{'S3cret' * 100}@{'S3cret' * 100}@rabbit/vh",
        "amqp://app:***@rabbit/vh",
    ),
    "a password of digits": ("amqp://app:12345-S3cret@rabbit/vh", "amqp://app:***@rabbit/vh"),
}


@pytest.mark.parametrize(("written", "shown"), CORPUS.values(), ids=CORPUS.keys())
def test_hides_every_secret_and_keeps_the_rest_as_written(written, shown):
    """The secret never appears in what redact_url shows; the user, host, port, vhost or database and options do."""
    assert redact_url(written) == shown
    assert "S3cret" not in redact_url(written)


@pytest.mark.parametrize(("written", "shown"), CORPUS.values(), ids=CORPUS.keys())
def test_masking_twice_changes_nothing(written, shown):
    """What redact_url shows is already clean: masking it again (the log redactor does) keeps it."""
    assert redact_url(shown) == shown


@pytest.mark.parametrize(("written", "shown"), CORPUS.values(), ids=CORPUS.keys())
def test_lists_each_secret_so_a_parsers_message_quoting_it_alone_can_be_masked(written, shown):
    """url_secrets names every secret the URL holds, as written and decoded: an error that quotes it alone is masked."""
    secrets = url_secrets(written)
    assert all("S3cret" in secret for secret in secrets)
    rest = written
    for secret in sorted(secrets, key=len, reverse=True):
        rest = rest.replace(secret, "")
    assert ("S3cret" in written) == bool(secrets) and "S3cret" not in rest


def test_masks_each_url_in_a_text_up_to_its_own_host():
    """In a text with two URLs, each is masked on its own: the mask never runs on into the next one."""
    text = "from amqp://a@x:S3cret-1@h1/vh to postgresql://b:S3cret@2@h2/db (user x@y)"
    assert redact_url(text) == "from amqp://a@x:***@h1/vh to postgresql://b:***@h2/db (user x@y)"


def test_a_url_without_a_host_is_masked_to_its_path_in_a_text_and_a_port_is_never_masked():
    """What follows ``user:`` is a password unless it is a numeric port: masked up to the path even with no host
    (the error about that URL shows it so), and masking the text again changes nothing."""
    text = "the port is not a number: amqp://u:S3cret-pw/vh (a node amqp://rabbit:5672/vh, mail ops@example.com)"
    shown = "the port is not a number: amqp://u:***/vh (a node amqp://rabbit:5672/vh, mail ops@example.com)"
    assert redact_url(text) == shown and redact_url(shown) == shown
