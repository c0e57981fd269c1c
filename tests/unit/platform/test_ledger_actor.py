"""The ledger's transports serve exactly the typed contract (no Ray cluster needed)."""

from __future__ import annotations

import inspect

from rayfleet.ledger._contract import LedgerClient, ledger_operations
from rayfleet.ledger._local import LocalLedgerClient
from rayfleet.platform._ledger_actor import LedgerActor, RayLedgerClient


def _public_methods(cls: type) -> set[str]:
    return {name for name, _ in inspect.getmembers(cls, inspect.isfunction) if not name.startswith("_")}


def _actor_methods() -> set[str]:
    # The class Ray wraps: every method Ray would let a caller reach, private ones included.
    cls = LedgerActor.__ray_metadata__.modified_class
    return {name for name, _ in inspect.getmembers(cls, inspect.isfunction) if name != "__init__"
            and not (name.startswith("__") and name.endswith("__"))}


def test_contract_lists_every_operation_once() -> None:
    operations = ledger_operations()
    assert len(operations) >= 40
    assert "acquire" in operations and "commit_checkpoints" in operations and "call" not in operations


# serving() tells a process on the actor's node that it may open the SQLite file itself
# (see platform/_ledger_client.py); it reads nothing of the ledger's and is not an operation.
NOT_OPERATIONS = {"serving"}


def test_ledger_actor_serves_exactly_the_contract() -> None:
    assert _actor_methods() == ledger_operations() | NOT_OPERATIONS


def test_transports_implement_exactly_the_contract() -> None:
    # close() ends a transport's own resources (threads, connections); it is not a ledger operation.
    assert _public_methods(RayLedgerClient) == ledger_operations() | NOT_OPERATIONS
    assert _public_methods(LocalLedgerClient) - {"close"} == ledger_operations()


def test_transport_signatures_match_the_contract() -> None:
    for name in ledger_operations():
        expected = inspect.signature(getattr(LedgerClient, name))
        for transport in (RayLedgerClient, LocalLedgerClient):
            assert inspect.signature(getattr(transport, name)) == expected, f"{transport.__name__}.{name}"
