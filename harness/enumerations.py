"""The enumerated values the database allows, written once: the harness, the CLI and the API read them here.

Each ``Literal`` below is the one Python source of a column the database constrains with a
``CHECK (column IN (…))`` (migrations 0001-0013); the tuple next to it is the same values for
code that iterates. The API's response and request models use these types, so a value the
database accepts can always be serialised (once, the event kind ``EXECUTION_RESOLVED``,
added by 0012, was missing from the API's copy and every resolved execution's detail answered
500). A migration that adds a value changes its CHECK and this module together:
``tests/migrations/test_enumerations.py`` reads the CHECK constraints from ``pg_constraint`` and fails on
any difference, and on an enumerated column of a table the API serves that is not listed here.
"""

from __future__ import annotations

from typing import Literal, get_args

__all__ = [
    "BY_COLUMN",
    "CHECKPOINT_STATUSES",
    "DEAD_LETTER_ACTIONS",
    "DEAD_LETTER_STATUSES",
    "EFFECTS",
    "EVENT_KINDS",
    "EVIDENCE_KINDS",
    "EXECUTION_STATUSES",
    "REPLAY_OUTCOMES",
    "RESOLUTION_COMMANDS",
    "RESOLVED_STATUSES",
    "CheckpointStatus",
    "DeadLetterAction",
    "DeadLetterStatus",
    "EffectName",
    "EventKind",
    "EvidenceKind",
    "ExecutionStatus",
    "ReplayOutcome",
    "ResolutionCommand",
    "ResolvedStatus",
]

# core.dead_letters.status (0001) and the audit ledger's action (0003, 0007).
DeadLetterStatus = Literal["pending_review", "replayed", "discarded"]
DeadLetterAction = Literal["replayed", "discarded", "released"]
# core.dead_letters.replay_outcome (0007): how a replayed delivery ended.
ReplayOutcome = Literal["processed", "duplicate", "dead_lettered", "released", "untracked"]

# core.executions.status (0010): the five stored states; SUCCEEDED is never stored.
ExecutionStatus = Literal["PENDING", "RUNNING", "RETRY_WAIT", "FAILED", "RECONCILIATION_REQUIRED"]
# core.execution_checkpoints.effect and .status (0010); harness.consumer.actions.Effect has the same values.
EffectName = Literal["READ_ONLY", "IDEMPOTENT_WRITE", "NON_IDEMPOTENT_WRITE"]
CheckpointStatus = Literal["STARTED", "SUCCEEDED", "FAILED", "UNCERTAIN"]
# core.execution_events.kind (0010; EXECUTION_RESOLVED since 0012).
EventKind = Literal["RETRY_SCHEDULED", "FAILED", "RECONCILIATION_REQUIRED", "TAKEN_OVER", "EXECUTION_RESOLVED"]

# core.execution_resolutions (0012): the command, the evidence it carries, the state it leaves.
ResolutionCommand = Literal["RESUME", "CLOSE_WITHOUT_TRANSITION"]
EvidenceKind = Literal["RESULT_VERIFIED", "ABSENT_VERIFIED", "COMPENSATED_VERIFIED"]
ResolvedStatus = Literal["PENDING", "FAILED"]

DEAD_LETTER_STATUSES: tuple[str, ...] = get_args(DeadLetterStatus)
DEAD_LETTER_ACTIONS: tuple[str, ...] = get_args(DeadLetterAction)
REPLAY_OUTCOMES: tuple[str, ...] = get_args(ReplayOutcome)
EXECUTION_STATUSES: tuple[str, ...] = get_args(ExecutionStatus)
EFFECTS: tuple[str, ...] = get_args(EffectName)
CHECKPOINT_STATUSES: tuple[str, ...] = get_args(CheckpointStatus)
EVENT_KINDS: tuple[str, ...] = get_args(EventKind)
RESOLUTION_COMMANDS: tuple[str, ...] = get_args(ResolutionCommand)
EVIDENCE_KINDS: tuple[str, ...] = get_args(EvidenceKind)
RESOLVED_STATUSES: tuple[str, ...] = get_args(ResolvedStatus)

# (table, column) in schema core → the values its CHECK constraint allows, as written above.
BY_COLUMN: dict[tuple[str, str], tuple[str, ...]] = {
    ("dead_letters", "status"): DEAD_LETTER_STATUSES,
    ("dead_letters", "replay_outcome"): REPLAY_OUTCOMES,
    ("dead_letter_actions", "action"): DEAD_LETTER_ACTIONS,
    ("executions", "status"): EXECUTION_STATUSES,
    ("execution_checkpoints", "effect"): EFFECTS,
    ("execution_checkpoints", "status"): CHECKPOINT_STATUSES,
    ("execution_events", "kind"): EVENT_KINDS,
    ("execution_resolutions", "command"): RESOLUTION_COMMANDS,
    ("execution_resolutions", "evidence_kind"): EVIDENCE_KINDS,
    ("execution_resolutions", "status_after"): RESOLVED_STATUSES,
}
