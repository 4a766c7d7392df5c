"""A mistake in what the user wrote — a consumer module, an action's declaration, the reference to it — is exit 2 and
one line naming what to fix, never a traceback, for every command that loads consumers (issue 17, item 11)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT
from support.api_support import AUDIENCE, ISSUER

from maintenance.cli import main
from maintenance.errors import EXIT_USAGE

UNREACHABLE = "postgresql://app:pw-never-used-7@127.0.0.1:1/core"  # a mistake is reported before any connection

HEADER = """\
from harness.consumer.actions import Action, Effect
from harness.consumer.consumer import Consumer
from harness.examples.points import CreditPoints
from harness.consumer.retry import RetryPolicy


def _call(payload, ctx):
    return {"ok": True}


def _handler(conn, payload, ctx):
    return None
"""

# kind → (the module mistaken.py as the user wrote it, the reference given, what the one line must say)
MISTAKES = {
    "action-policy-without-justification": (
        HEADER
        + """
consumer = Consumer(
    name="points.mistaken", queue="points.mistaken", payload_schema=CreditPoints, handler=_handler,
    actions=(Action(name="lookup", effect=Effect.READ_ONLY, call=_call, retry_policy=RetryPolicy(max_attempts=5)),),
)
""",
        "mistaken:consumer",
        [
            "mistaken.py, line 16",
            "ActionError: action lookup: a retry_policy other than the published defaults needs a retry_justification (R-2)",
        ],
    ),
    "consumer-policy-without-justification": (
        HEADER
        + """
consumer = Consumer(
    name="points.mistaken", queue="points.mistaken", payload_schema=CreditPoints, handler=_handler,
    retry_policy=RetryPolicy(max_attempts=5),
)
""",
        "mistaken:consumer",
        ["mistaken.py, line 14", "ConsumerError: consumer points.mistaken: a retry_policy other than"],
    ),
    "handler-that-cannot-take-conn-payload-ctx": (
        HEADER
        + """
def _two(conn, payload):
    return None


consumer = Consumer(name="points.mistaken", queue="points.mistaken", payload_schema=CreditPoints, handler=_two)
""",
        "mistaken:consumer",
        [
            "mistaken.py, line 18",
            "ConsumerError: consumer points.mistaken: handler _two(conn, payload) cannot be called as"
            " handler(conn, payload, ctx)",
        ],
    ),
    "action-call-that-cannot-take-payload-ctx": (
        HEADER
        + """
LOOKUP = Action(name="lookup", effect=Effect.READ_ONLY, call=lambda payload: None)
""",
        "mistaken:consumer",
        [
            "mistaken.py, line 14",
            "ActionError: action lookup: call <lambda>(payload) cannot be called as call(payload, ctx)",
        ],
    ),
    "syntax-error": ("consumer = Consumer(\n", "mistaken:consumer", ["mistaken.py, line 1", "SyntaxError: "]),
    "error-at-import": (
        "import os\nTOKEN = os.environ['MISTAKEN_TOKEN_NOT_SET']\n",
        "mistaken:consumer",
        ["mistaken.py, line 2", "KeyError: 'MISTAKEN_TOKEN_NOT_SET'"],
    ),
    "exit-at-import": ("import sys\nsys.exit(3)\n", "mistaken:consumer", ["mistaken.py, line 2", "SystemExit: 3"]),
    "missing-dependency": (
        "import mistaken_dependency_not_installed\n",
        "mistaken:consumer",
        ["cannot import mistaken: No module named 'mistaken_dependency_not_installed'"],
    ),
    "missing-attribute": (HEADER, "mistaken:consumer", ["module mistaken has no consumer"]),
    "not-a-consumer": ("consumer = 42\n", "mistaken:consumer", ["mistaken.consumer is not a harness Consumer"]),
    "not-module-colon-object": (HEADER, "mistaken", ["expected module:object"]),
}


@pytest.fixture(autouse=True)
def forget_mistaken():
    """Each test imports its own ``mistaken`` (an in-process command would find the last test's in sys.modules)."""
    sys.modules.pop("mistaken", None)
    importlib.invalidate_caches()
    yield
    sys.modules.pop("mistaken", None)


def write_module(folder: Path, kind: str) -> str:
    """Write ``mistaken.py`` of this kind into ``folder``; the reference to give."""
    source, reference, _ = MISTAKES[kind]
    (folder / "mistaken.py").write_text(source)
    return reference


def assert_one_clear_line(err: str, label: str, reference: str, kind: str) -> None:
    assert "Traceback" not in err, err
    assert err.count("\n") == 1, err
    assert err.startswith(f"core-jobs: configuration error: {label} {reference!r}: "), err
    for fragment in MISTAKES[kind][2]:
        assert fragment in err, err


@pytest.mark.parametrize("kind", MISTAKES)
def test_a_worker_given_a_mistaken_consumer_exits_2_with_one_line_naming_it(tmp_path, kind):
    """`core-jobs worker --consumer` with each kind of mistake: exit 2, no traceback, one stderr line naming the
    reference, the file and line where there is one, and the error."""
    reference = write_module(tmp_path, kind)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORE_JOBS_")}
    env |= {"CORE_JOBS_DATABASE_URL": UNREACHABLE, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    done = subprocess.run(
        [sys.executable, "-m", "maintenance", "worker", "--once", "--consumer", reference],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == EXIT_USAGE, done.stderr
    assert_one_clear_line(done.stderr, "--consumer", reference, kind)


@pytest.mark.parametrize("kind", MISTAKES)
def test_check_config_given_a_mistaken_consumer_exits_2_with_one_line_naming_it(clean_env, capsys, tmp_path, kind):
    """`core-jobs check-config --consumer` with each kind of mistake: exit 2 and the same one line on stderr."""
    reference = write_module(tmp_path, kind)
    clean_env.syspath_prepend(str(tmp_path))
    assert main(["check-config", "--consumer", reference]) == EXIT_USAGE
    assert_one_clear_line(capsys.readouterr().err, "--consumer", reference, kind)


@pytest.mark.parametrize("kind", MISTAKES)
def test_the_api_given_a_mistaken_published_definition_exits_2_with_one_line_naming_it(
    clean_env, capsys, tmp_path, jwks, kind
):
    """`core-jobs api` in admin mode with each kind of mistake in a CORE_JOBS_ADMIN_CONSUMERS entry: exit 2, one line."""
    reference = write_module(tmp_path, kind)
    clean_env.syspath_prepend(str(tmp_path))
    for name, value in {
        "DATABASE_URL": UNREACHABLE,
        "API_JWKS_URL": jwks.url,
        "API_JWT_ISSUER": ISSUER,
        "API_JWT_AUDIENCE": AUDIENCE,
        "ADMIN_ENABLED": "true",
        "ADMIN_CONSUMERS": reference,
        "ADMIN_BUSINESS_SCOPES": "loyalty",
    }.items():
        clean_env.setenv(f"CORE_JOBS_{name}", value)
    code = main(["api", "--port", "0"])
    err = capsys.readouterr().err
    if kind == "not-module-colon-object":  # refused when the settings load, naming the variable
        assert code == EXIT_USAGE and "CORE_JOBS_ADMIN_CONSUMERS" in err and "Traceback" not in err
        return
    assert code == EXIT_USAGE, err
    assert_one_clear_line(err, "CORE_JOBS_ADMIN_CONSUMERS entry", reference, kind)


@pytest.mark.parametrize(
    "argv",
    [
        ["worker", "--consumer", "harness.examples.points:consumer", "--once"],
        ["check-config", "--consumer", "harness.examples.points:consumer"],
        ["enqueue", "points.credit", "--payload", "{}"],
        ["executions", "list"],
        ["dead-letters", "list"],
        ["api", "--port", "0"],
        ["run-once"],
    ],
    ids=lambda argv: argv[0],
)
def test_a_mistaken_setting_exits_2_naming_it_for_every_command(clean_env, capsys, argv):
    """A setting the user got wrong (a negative lease) is exit 2 and one line naming the variable, whatever the command."""
    clean_env.setenv("CORE_JOBS_DATABASE_URL", UNREACHABLE)
    clean_env.setenv("CORE_JOBS_WORKER_LEASE", "-PT30S")
    assert main(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("core-jobs: configuration error: CORE_JOBS_WORKER_LEASE: ") and err.count("\n") == 1, err


def test_a_mistaken_consumer_s_message_masks_the_secrets_it_quotes(tmp_path, clean_env, capsys):
    """A module whose import error quotes a configured secret: the one line names the error with the secret masked."""
    (tmp_path / "mistaken.py").write_text("raise ValueError('cannot log in with pw-never-used-7')\n")
    clean_env.syspath_prepend(str(tmp_path))
    clean_env.setenv("CORE_JOBS_DATABASE_URL", UNREACHABLE)
    assert main(["check-config", "--consumer", "mistaken:consumer"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "ValueError: cannot log in with" in err and "pw-never-used-7" not in err, err
