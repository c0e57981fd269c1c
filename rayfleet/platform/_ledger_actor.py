"""The ledger as a detached, restartable Ray actor, and the client that reaches it over Ray.

``LedgerActor`` serves exactly the operations of the typed contract
(:class:`~rayfleet.ledger._contract.LedgerClient`), one named actor method each, and
nothing else: the ``Ledger`` it wraps is private to it. Ray runs the methods one at a
time in arrival order. A refusal (a ``RayfleetError``) travels back as a value, so the
caller receives the ledger's own error rather than Ray's wrapper around it.

The methods of both are generated from the contract (``_generated_actor.py``); this
module adds only what is not an operation.
"""

from __future__ import annotations

import ray

from ..errors import RayfleetError
from ..ledger._contract import LedgerCall
from ..ledger._ledger import Ledger
from ..ledger._local import LocalLedgerClient
from ._binding import bind_fleet
from ._generated_actor import ActorOperations, RayOperations
from ._ledger_transport import LEDGER_ACTOR_NAME, Answer, RayCall, answer

__all__ = ["LEDGER_ACTOR_NAME", "LedgerActor", "RayLedgerClient"]


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)
class LedgerActor(ActorOperations):
    """Serves one :class:`Ledger` over Ray: one method per contract operation.

    Restartable: a restarted actor reopens the same SQLite file, and the ledger's
    lock-delay keeps leases that were held from moving for one TTL.
    """

    def __init__(self, path: str, storage: str | None = None) -> None:
        self._ledger = Ledger(path)
        self._refusal: RayfleetError | None = None
        if storage is not None:
            # A restarted actor checks again: it may have found an empty file on a new node.
            # A refusal answers every call (an exception here would only say "actor died").
            try:
                bind_fleet(LocalLedgerClient(self._ledger), storage=storage, ledger_shown=self._ledger.location)
            except RayfleetError as error:
                self._refusal = error

    def serving(self) -> Answer[tuple[str, str | None]]:
        """The Ray node this actor runs on and the fleet id its file holds (see ``RayLedgerClient.serving``)."""
        def serving() -> tuple[str, str | None]:
            return str(ray.get_runtime_context().get_node_id()), self._ledger.fleet_identity()

        return answer(self._refusal, serving)


class RayLedgerClient(RayOperations):
    """The ledger contract over Ray: each operation is one task on the ledger actor.

    Hosts and the runner await its calls; the driver waits with ``.result()``.
    """

    def serving(self) -> LedgerCall[tuple[str, str | None]]:
        """``(node id, fleet id)``: where the actor runs and which fleet its SQLite file belongs to.

        Not part of the ledger contract: only a process on that node may open the file
        itself, and only if it finds the same fleet there.
        """
        return RayCall(self.actor.serving.remote())
