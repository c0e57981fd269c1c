"""The ledger contract: every operation of the one authority for leases, fencing tokens and continuity.

Hosts, drivers and the workflow runner reach the ledger only through a
:class:`LedgerClient`; each operation returns a :class:`LedgerCall` (await it, or call
``.result()``) whose reply is one of the frozen values below. Fenced writes present
``(identity, fencing_token)`` and are refused with ``StaleFencingTokenError`` when a
larger token was issued since. Plain Python, no Ray.

Most users never touch this namespace: ``rayfleet.connect()`` wires a ledger up. It is
public for tests (``rayfleet.testing.LocalLedgerClient`` serves this contract in one
process) and for anyone implementing a store.
"""

from __future__ import annotations

from ..identity._values import LeaseDenied as LeaseDenied
from ..identity._values import LeaseGrant as LeaseGrant
from ..identity._values import SnapshotPointer as SnapshotPointer
from ._contract import LedgerCall as LedgerCall
from ._contract import LedgerClient as LedgerClient
from ._location import LedgerLocation as LedgerLocation
from ._turn_rows import AbandonedSweep as AbandonedSweep
from ._turn_rows import ApprovalRequest as ApprovalRequest
from ._turn_rows import ApprovalResolved as ApprovalResolved
from ._turn_rows import ApprovalRow as ApprovalRow
from ._turn_rows import TimerFired as TimerFired
from ._turn_rows import TimerRow as TimerRow
from ._turn_rows import TimerSpec as TimerSpec
from ._turn_rows import TurnEnd as TurnEnd
from ._turn_rows import TurnEntry as TurnEntry
from ._turn_rows import TurnEntryKind as TurnEntryKind
from ._turn_rows import TurnEntryState as TurnEntryState
from ._turn_rows import TurnEventRow as TurnEventRow
from ._turn_rows import TurnRecord as TurnRecord
from ._turn_rows import TurnWake as TurnWake
from ._turn_rows import TurnWrite as TurnWrite
from ._values import Activation as Activation
from ._values import CheckpointCommit as CheckpointCommit
from ._values import CheckpointRow as CheckpointRow
from ._values import EdgeRow as EdgeRow
from ._values import IdentityView as IdentityView
from ._values import JournalEntry as JournalEntry
from ._values import JournalRecord as JournalRecord
from ._values import LeaseView as LeaseView
from ._values import RegisterOutcome as RegisterOutcome
from ._values import RunLease as RunLease
from ._values import RunRecord as RunRecord
from ._values import RunRequests as RunRequests
from ._values import RunStart as RunStart
from ._values import SpecRecord as SpecRecord
from ._values import StepEntry as StepEntry
from ._values import StepJournaled as StepJournaled
from ._values import StoredMessage as StoredMessage
from ._values import TopologyChange as TopologyChange
from ._values import TopologySnapshot as TopologySnapshot

__all__ = [
    # The contract
    "LedgerCall",
    "LedgerClient",
    "LedgerLocation",
    # What operations take
    "ApprovalRequest",
    "CheckpointCommit",
    "SpecRecord",
    "StepEntry",
    "TimerFired",
    "TimerSpec",
    "TopologyChange",
    "TurnEnd",
    "TurnEntry",
    "TurnEntryKind",
    "TurnEntryState",
    "TurnWrite",
    # What operations return
    "AbandonedSweep",
    "Activation",
    "ApprovalResolved",
    "ApprovalRow",
    "CheckpointRow",
    "EdgeRow",
    "IdentityView",
    "JournalEntry",
    "JournalRecord",
    "LeaseDenied",
    "LeaseGrant",
    "LeaseView",
    "RegisterOutcome",
    "RunLease",
    "RunRecord",
    "RunRequests",
    "RunStart",
    "SnapshotPointer",
    "StepJournaled",
    "StoredMessage",
    "TimerRow",
    "TopologySnapshot",
    "TurnEventRow",
    "TurnRecord",
    "TurnWake",
]
