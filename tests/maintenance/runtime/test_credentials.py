"""The one credential detector (maintenance/runtime/credentials.py) against a corpus: what it finds, what it masks (pure)."""

from __future__ import annotations

import pytest
from support.credential_corpus import CREDENTIALS, ORDINARY

from maintenance.runtime.credentials import credential_kind, mask_credentials
from maintenance.runtime.logs import SecretRedactor

pytestmark = pytest.mark.pure

_SHAPED = [c for c in CREDENTIALS if c[0] != "high-entropy"]


@pytest.mark.parametrize(("text", "secret"), [c[1:] for c in CREDENTIALS], ids=[c[0] for c in CREDENTIALS])
def test_finds_every_credential_of_the_corpus(text, secret):
    """Every credential of the corpus is named by credential_kind, whatever its shape."""
    assert credential_kind(text) is not None


@pytest.mark.parametrize("text", [c[1] for c in ORDINARY], ids=[c[0] for c in ORDINARY])
def test_finds_nothing_in_ordinary_evidence(text):
    """Ticket ids, provider references, URLs without credentials and prose are not mistaken for a credential."""
    assert credential_kind(text) is None


@pytest.mark.parametrize(("text", "secret"), [c[1:] for c in _SHAPED], ids=[c[0] for c in _SHAPED])
def test_the_log_redactor_masks_every_shaped_credential_of_the_corpus(text, secret):
    """The log redactor masks the secret part of every credential shape the evidence screening refuses."""
    assert secret not in SecretRedactor().redact(text)
    assert secret not in mask_credentials(text)


@pytest.mark.parametrize("text", [c[1] for c in ORDINARY], ids=[c[0] for c in ORDINARY])
def test_the_log_redactor_leaves_ordinary_text_alone(text):
    """Ordinary evidence passes through the log redactor unchanged."""
    assert SecretRedactor().redact(text) == text


def test_joining_the_lines_of_ordinary_text_finds_nothing():
    """Several lines of ordinary evidence, which the detector also reads joined, are neither refused nor masked."""
    text = "checked the console\nmessage msg-9 sent at 08:02\nno charge created, OPS-4711\nauth: required"
    assert credential_kind(text) is None
    assert mask_credentials(text) == text


def test_a_credential_visible_only_decoded_is_masked_in_the_decoded_text():
    """A password escaped in JSON or percent-encoded is masked in the decoded text, and the rest of the line survives."""
    assert (
        mask_credentials('sent {\\"password\\": \\"hunter2pw\\"} to OPS-4711') == 'sent {"password": ***} to OPS-4711'
    )
    assert mask_credentials("next=postgresql%3A%2F%2Fapp%3AHunter2pw%40db") == "next=postgresql://app:***@db"


@pytest.mark.parametrize(("text", "secret"), [c[1:] for c in _SHAPED], ids=[c[0] for c in _SHAPED])
def test_the_log_redactor_remembers_only_clean_text_so_a_credential_is_masked_every_time(text, secret):
    """A string found clean is remembered (a request log repeats the same few), one holding a credential never: masked again each time."""
    redactor = SecretRedactor()
    for _ in range(3):
        assert secret not in redactor.redact(text)
        assert redactor.redact("maintenance.api.request") == "maintenance.api.request"
    assert "maintenance.api.request" in redactor.clean and text not in redactor.clean
