"""The ledger as a detached, restartable Ray actor, and the client that reaches it over Ray.

``LedgerActor`` serves exactly the operations of the typed contract
(:class:`~rayfleet.ledger._contract.LedgerClient`), one named actor method each, and
nothing else: the ``Ledger`` it wraps is private to it. Ray runs the methods one at a
time in arrival order. A refusal (a ``RayfleetError``) travels back as a value, so the
caller receives the ledger's own error rather than Ray's wrapper around it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from typing import Any, Generic, TypeVar

import ray

from ..errors import LedgerUnavailableError, RayfleetError
from ..identity._values import (
    ContinuityRecord,
    LeaseDenied,
    SnapshotPointer,
)
from ..ledger._contract import LedgerCall
from ..ledger._ledger import Ledger
from ..ledger._local import LocalLedgerClient
from ..ledger._values import (
    DEFAULT_LEASE_TTL,
    Activation,
    CheckpointCommit,
    CheckpointRow,
    CommitOutcome,
    HostInfo,
    IdentityView,
    JournalRecord,
    LeaseView,
    RegisterOutcome,
    RunLease,
    RunRecord,
    RunRequests,
    RunStart,
    SpecRecord,
    StoredMessage,
    TopologyChange,
    TopologySnapshot,
)
from ._binding import bind_fleet
from ._metrics import RayLedgerMetrics

LEDGER_ACTOR_NAME = "rayfleet-ledger"

T = TypeVar("T")


class _Refusal:
    """A ledger error carried as a return value (Ray would wrap a raised one)."""

    __slots__ = ("error",)

    def __init__(self, error: RayfleetError) -> None:
        self.error = error

    def __reduce__(self) -> tuple[type[_Refusal], tuple[RayfleetError]]:
        return (_Refusal, (self.error,))


_METRICS = RayLedgerMetrics()


def _answer(refusal: RayfleetError | None, operation: Callable[..., Any], args: tuple[Any, ...],
            kwargs: dict[str, Any], *, name: str | None = None) -> Any:
    if refusal is not None:
        return _Refusal(refusal)
    started = time.perf_counter()
    outcome = "OK"
    try:
        return operation(*args, **kwargs)
    except RayfleetError as error:
        outcome = type(error).__name__
        return _Refusal(error)
    finally:
        _METRICS.operation(name or operation.__name__, outcome, time.perf_counter() - started)


def _unwrap(reply: Any) -> Any:
    if isinstance(reply, _Refusal):
        raise reply.error
    return reply


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)
class LedgerActor:
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

    def incarnation(self) -> Any:
        return _answer(self._refusal, lambda: self._ledger.incarnation, (), {}, name="incarnation")

    def serving(self) -> Any:
        """The Ray node this actor runs on and the fleet id its file holds (see ``RayLedgerClient.serving``)."""
        return _answer(
            self._refusal, lambda: (ray.get_runtime_context().get_node_id(), self._ledger.fleet_identity()), (), {},
            name="serving",
        )

    def fleet_identity(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.fleet_identity, args, kwargs)

    def register_many(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.register_many, args, kwargs)

    def register(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.register, args, kwargs)

    def apply_specs(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.apply_specs, args, kwargs)

    def resolve(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.resolve, args, kwargs)

    def list_identities(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.list_identities, args, kwargs)

    def select_identities(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.select_identities, args, kwargs)

    def leases(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.leases, args, kwargs)

    def set_lifecycle(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.set_lifecycle, args, kwargs)

    def reset(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.reset, args, kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.delete, args, kwargs)

    def acquire(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.acquire, args, kwargs)

    def renew(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.renew, args, kwargs)

    def renew_holder(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.renew_holder, args, kwargs)

    def arm_holder(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.arm_holder, args, kwargs)

    def release(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.release, args, kwargs)

    def revoke_holder(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.revoke_holder, args, kwargs)

    def check_fence(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.check_fence, args, kwargs)

    def high_water(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.high_water, args, kwargs)

    def commit_checkpoints(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.commit_checkpoints, args, kwargs)

    def latest_checkpoints(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.latest_checkpoints, args, kwargs)

    def dedup_window(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.dedup_window, args, kwargs)

    def referenced_snapshot_files(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.referenced_snapshot_files, args, kwargs)

    def wired_peers(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.wired_peers, args, kwargs)

    def set_desired_edge(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.set_desired_edge, args, kwargs)

    def topology(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.topology, args, kwargs)

    def apply_topology(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.apply_topology, args, kwargs)

    def create_run(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.create_run, args, kwargs)

    def run(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.run, args, kwargs)

    def list_runs(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.list_runs, args, kwargs)

    def run_definition(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.run_definition, args, kwargs)

    def set_run_status(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.set_run_status, args, kwargs)

    def request_run(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.request_run, args, kwargs)

    def journal(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.journal, args, kwargs)

    def journal_step(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.journal_step, args, kwargs)

    def journal_compensation(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.journal_compensation, args, kwargs)

    def acquire_run_lease(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.acquire_run_lease, args, kwargs)

    def start_run(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.start_run, args, kwargs)

    def renew_run_lease(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.renew_run_lease, args, kwargs)

    def release_run_lease(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.release_run_lease, args, kwargs)

    def acquire_step_lease(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.acquire_step_lease, args, kwargs)

    def release_step_lease(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.release_step_lease, args, kwargs)

    def set_paused(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.set_paused, args, kwargs)

    def is_paused(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.is_paused, args, kwargs)

    def park(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.park, args, kwargs)

    def parked(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.parked, args, kwargs)

    def unpark(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.unpark, args, kwargs)

    def cancel_parked(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.cancel_parked, args, kwargs)

    def add_dead_letter(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.add_dead_letter, args, kwargs)

    def hold_tell(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.hold_tell, args, kwargs)

    def claim_tells(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.claim_tells, args, kwargs)

    def settle_tell(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.settle_tell, args, kwargs)

    def dead_letters(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.dead_letters, args, kwargs)

    def dead_letter(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.dead_letter, args, kwargs)

    def purge_dead_letters(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.purge_dead_letters, args, kwargs)

    def register_host(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.register_host, args, kwargs)

    def remove_host(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.remove_host, args, kwargs)

    def set_host_draining(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.set_host_draining, args, kwargs)

    def hosts(self, *args: Any, **kwargs: Any) -> Any:
        return _answer(self._refusal, self._ledger.hosts, args, kwargs)


def _unreachable(error: ray.exceptions.RayActorError) -> LedgerUnavailableError:
    """The ledger actor died or is restarting: the typed, retryable error, never Ray's own.

    The call may have run before the actor died, so a write's outcome is unknown.
    """
    return LedgerUnavailableError(
        location=f"the ledger actor {LEDGER_ACTOR_NAME!r}", detail=f"{type(error).__name__} (it restarts by itself)",
        committed_unknown=True,
    )


class _RayCall(Generic[T]):
    """A :class:`LedgerCall` in flight on the ledger actor.

    A ledger actor that dies or restarts under the call raises ``LedgerUnavailableError``
    (retryable, ``committed_unknown``), so hosts, the runner and the driver see the
    ledger's typed error, not a Ray exception or an "internal error".
    """

    __slots__ = ("_ref",)

    def __init__(self, ref: ray.ObjectRef) -> None:
        self._ref = ref

    def __await__(self) -> Generator[Any, None, T]:
        try:
            reply = yield from self._ref.__await__()
        except ray.exceptions.RayActorError as error:
            raise _unreachable(error) from error
        return _unwrap(reply)  # type: ignore[no-any-return]

    def result(self, timeout: float | None = None) -> T:
        try:
            reply = ray.get(self._ref, timeout=timeout)
        except ray.exceptions.RayActorError as error:
            raise _unreachable(error) from error
        return _unwrap(reply)  # type: ignore[no-any-return]


class RayLedgerClient:
    """The ledger contract over Ray: each operation is one task on the ledger actor.

    Hosts and the runner await its calls; the driver waits with ``.result()``.
    """

    route = "ledger actor"

    def __init__(self, actor: ray.actor.ActorHandle) -> None:
        self.actor = actor

    def incarnation(self) -> LedgerCall[str]:
        return _RayCall(self.actor.incarnation.remote())

    def serving(self) -> LedgerCall[tuple[str, str | None]]:
        """``(node id, fleet id)``: where the actor runs and which fleet its SQLite file belongs to.

        Not part of the ledger contract: only a process on that node may open the file
        itself, and only if it finds the same fleet there.
        """
        return _RayCall(self.actor.serving.remote())

    def fleet_identity(self, claim: str | None = None) -> LedgerCall[str | None]:
        return _RayCall(self.actor.fleet_identity.remote(claim))

    def register_many(self, records: Sequence[SpecRecord]) -> LedgerCall[list[RegisterOutcome]]:
        return _RayCall(self.actor.register_many.remote(list(records)))

    def register(self, record: SpecRecord) -> LedgerCall[RegisterOutcome]:
        return _RayCall(self.actor.register.remote(record))

    def apply_specs(self, *, creates: Sequence[SpecRecord], updates: Sequence[SpecRecord]) -> LedgerCall[None]:
        return _RayCall(self.actor.apply_specs.remote(creates=creates, updates=updates))

    def resolve(self, identities: Iterable[str]) -> LedgerCall[dict[str, IdentityView]]:
        return _RayCall(self.actor.resolve.remote(list(identities)))

    def list_identities(self, *, labels: Mapping[str, str] | None = None) -> LedgerCall[list[IdentityView]]:
        return _RayCall(self.actor.list_identities.remote(labels=labels))

    def select_identities(self, *, labels: Mapping[str, str]) -> LedgerCall[list[str]]:
        return _RayCall(self.actor.select_identities.remote(labels=dict(labels)))

    def leases(self, identities: Iterable[str]) -> LedgerCall[dict[str, LeaseView | None]]:
        return _RayCall(self.actor.leases.remote(list(identities)))

    def set_lifecycle(
        self, *, identity: str, fencing_token: int, lifecycle: str, reason: str = ""
    ) -> LedgerCall[None]:
        return _RayCall(self.actor.set_lifecycle.remote(
            identity=identity, fencing_token=fencing_token, lifecycle=lifecycle, reason=reason
        ))

    def reset(self, *, identity: str, fencing_token: int) -> LedgerCall[ContinuityRecord]:
        return _RayCall(self.actor.reset.remote(identity=identity, fencing_token=fencing_token))

    def delete(self, *, identity: str, fencing_token: int) -> LedgerCall[SnapshotPointer | None]:
        return _RayCall(self.actor.delete.remote(identity=identity, fencing_token=fencing_token))

    def acquire(
        self, *, holder: str, identities: Iterable[str], ttl: float = DEFAULT_LEASE_TTL, create_continuity: bool = True
    ) -> LedgerCall[dict[str, Activation | LeaseDenied | RayfleetError]]:
        return _RayCall(self.actor.acquire.remote(
            holder=holder, identities=list(identities), ttl=ttl, create_continuity=create_continuity
        ))

    def renew(self, *, holder: str, tokens: Mapping[str, int]) -> LedgerCall[frozenset[str]]:
        return _RayCall(self.actor.renew.remote(holder=holder, tokens=tokens))

    def renew_holder(self, *, holder: str, ttl: float) -> LedgerCall[bool]:
        return _RayCall(self.actor.renew_holder.remote(holder=holder, ttl=ttl))

    def arm_holder(self, *, holder: str, ttl: float) -> LedgerCall[int]:
        return _RayCall(self.actor.arm_holder.remote(holder=holder, ttl=ttl))

    def release(self, *, holder: str, tokens: Mapping[str, int]) -> LedgerCall[int]:
        return _RayCall(self.actor.release.remote(holder=holder, tokens=tokens))

    def revoke_holder(self, holder: str) -> LedgerCall[list[str]]:
        return _RayCall(self.actor.revoke_holder.remote(holder))

    def check_fence(self, identity: str, token: int) -> LedgerCall[None]:
        return _RayCall(self.actor.check_fence.remote(identity, token))

    def high_water(self, identity: str) -> LedgerCall[int]:
        return _RayCall(self.actor.high_water.remote(identity))

    def commit_checkpoints(self, commits: Sequence[CheckpointCommit]) -> LedgerCall[list[CommitOutcome]]:
        return _RayCall(self.actor.commit_checkpoints.remote(list(commits)))

    def latest_checkpoints(
        self, *, after: str = "", limit: int = 1000, agent_class: str | None = None
    ) -> LedgerCall[list[CheckpointRow]]:
        return _RayCall(self.actor.latest_checkpoints.remote(after=after, limit=limit, agent_class=agent_class))

    def dedup_window(self, identity: str) -> LedgerCall[list[tuple[str, bytes]]]:
        return _RayCall(self.actor.dedup_window.remote(identity))

    def referenced_snapshot_files(self) -> LedgerCall[set[str]]:
        return _RayCall(self.actor.referenced_snapshot_files.remote())

    def wired_peers(self, identities: Iterable[str]) -> LedgerCall[dict[str, tuple[str, ...]]]:
        return _RayCall(self.actor.wired_peers.remote(list(identities)))

    def set_desired_edge(self, *, a: str, b: str, desired: bool) -> LedgerCall[None]:
        return _RayCall(self.actor.set_desired_edge.remote(a=a, b=b, desired=desired))

    def topology(self) -> LedgerCall[TopologySnapshot]:
        return _RayCall(self.actor.topology.remote())

    def apply_topology(self, change: TopologyChange) -> LedgerCall[None]:
        return _RayCall(self.actor.apply_topology.remote(change))

    def create_run(
        self, *, run_id: str, workflow: str, code_version: str, definition: bytes | None, force: bool = False
    ) -> LedgerCall[str]:
        return _RayCall(self.actor.create_run.remote(
            run_id=run_id, workflow=workflow, code_version=code_version, definition=definition, force=force
        ))

    def run(self, run_id: str) -> LedgerCall[RunRecord | None]:
        return _RayCall(self.actor.run.remote(run_id))

    def list_runs(self, *, statuses: Sequence[str] | None = None) -> LedgerCall[list[RunRecord]]:
        return _RayCall(self.actor.list_runs.remote(statuses=statuses))

    def run_definition(self, run_id: str) -> LedgerCall[bytes | None]:
        return _RayCall(self.actor.run_definition.remote(run_id))

    def set_run_status(
        self, *, run_id: str, fencing_token: int, status: str, detail: str | None = "", outcome: bytes | None = None,
        release_holder: str | None = None,
    ) -> LedgerCall[RunRequests]:
        return _RayCall(self.actor.set_run_status.remote(
            run_id=run_id, fencing_token=fencing_token, status=status, detail=detail, outcome=outcome,
            release_holder=release_holder,
        ))

    def request_run(
        self, *, run_id: str, cancel: bool | None = None, pause: bool | None = None
    ) -> LedgerCall[bool]:
        return _RayCall(self.actor.request_run.remote(run_id=run_id, cancel=cancel, pause=pause))

    def journal(self, run_id: str) -> LedgerCall[JournalRecord]:
        return _RayCall(self.actor.journal.remote(run_id))

    def journal_step(
        self, *, run_id: str, fencing_token: int, label: str, output: bytes, tokens: int
    ) -> LedgerCall[RunRequests]:
        return _RayCall(self.actor.journal_step.remote(
            run_id=run_id, fencing_token=fencing_token, label=label, output=output, tokens=tokens
        ))

    def journal_compensation(
        self, *, run_id: str, fencing_token: int, label: str, ok: bool, error: str
    ) -> LedgerCall[None]:
        return _RayCall(self.actor.journal_compensation.remote(
            run_id=run_id, fencing_token=fencing_token, label=label, ok=ok, error=error
        ))

    def acquire_run_lease(
        self, *, run_id: str, holder: str, ttl: float = DEFAULT_LEASE_TTL, takeover_from: str | None = None
    ) -> LedgerCall[RunLease]:
        return _RayCall(self.actor.acquire_run_lease.remote(
            run_id=run_id, holder=holder, ttl=ttl, takeover_from=takeover_from
        ))

    def start_run(
        self, *, run_id: str, holder: str, ttl: float = DEFAULT_LEASE_TTL, takeover_from: str | None = None
    ) -> LedgerCall[RunStart]:
        return _RayCall(self.actor.start_run.remote(run_id=run_id, holder=holder, ttl=ttl,
                                                    takeover_from=takeover_from))

    def renew_run_lease(self, *, run_id: str, holder: str, token: int) -> LedgerCall[RunLease]:
        return _RayCall(self.actor.renew_run_lease.remote(run_id=run_id, holder=holder, token=token))

    def release_run_lease(self, *, run_id: str, holder: str, token: int) -> LedgerCall[bool]:
        return _RayCall(self.actor.release_run_lease.remote(run_id=run_id, holder=holder, token=token))

    def acquire_step_lease(
        self, *, run_id: str, label: str, holder: str, fencing_token: int, ttl: float
    ) -> LedgerCall[int]:
        return _RayCall(self.actor.acquire_step_lease.remote(
            run_id=run_id, label=label, holder=holder, fencing_token=fencing_token, ttl=ttl
        ))

    def release_step_lease(self, *, run_id: str, label: str, holder: str, token: int) -> LedgerCall[bool]:
        return _RayCall(self.actor.release_step_lease.remote(run_id=run_id, label=label, holder=holder, token=token))

    def set_paused(self, *, identity: str, fencing_token: int, paused: bool) -> LedgerCall[None]:
        return _RayCall(self.actor.set_paused.remote(identity=identity, fencing_token=fencing_token, paused=paused))

    def is_paused(self, identity: str) -> LedgerCall[bool]:
        return _RayCall(self.actor.is_paused.remote(identity))

    def park(self, *, identity: str, fencing_token: int, message_id: str, envelope: bytes) -> LedgerCall[int]:
        return _RayCall(self.actor.park.remote(
            identity=identity, fencing_token=fencing_token, message_id=message_id, envelope=envelope
        ))

    def parked(self, identity: str, *, limit: int = 1000) -> LedgerCall[list[StoredMessage]]:
        return _RayCall(self.actor.parked.remote(identity, limit=limit))

    def unpark(self, *, identity: str, fencing_token: int, seq: int) -> LedgerCall[None]:
        return _RayCall(self.actor.unpark.remote(identity=identity, fencing_token=fencing_token, seq=seq))

    def cancel_parked(self, *, identity: str, fencing_token: int) -> LedgerCall[int]:
        return _RayCall(self.actor.cancel_parked.remote(identity=identity, fencing_token=fencing_token))

    def add_dead_letter(
        self, *, identity: str, message_id: str, envelope: bytes, reason: str, error: str, attempts: int
    ) -> LedgerCall[int]:
        return _RayCall(self.actor.add_dead_letter.remote(
            identity=identity, message_id=message_id, envelope=envelope, reason=reason, error=error, attempts=attempts
        ))

    def hold_tell(self, *, identity: str, message_id: str, envelope: bytes) -> LedgerCall[int]:
        return _RayCall(self.actor.hold_tell.remote(identity=identity, message_id=message_id, envelope=envelope))

    def claim_tells(self, *, min_age: float, limit: int = 100) -> LedgerCall[list[StoredMessage]]:
        return _RayCall(self.actor.claim_tells.remote(min_age=min_age, limit=limit))

    def settle_tell(
        self, *, identity: str, message_id: str, reason: str | None = None, error: str = ""
    ) -> LedgerCall[bool]:
        return _RayCall(self.actor.settle_tell.remote(identity=identity, message_id=message_id, reason=reason,
                                                      error=error))

    def dead_letters(self, *, identity: str | None = None, limit: int = 1000) -> LedgerCall[list[StoredMessage]]:
        return _RayCall(self.actor.dead_letters.remote(identity=identity, limit=limit))

    def dead_letter(self, letter_id: int) -> LedgerCall[StoredMessage | None]:
        return _RayCall(self.actor.dead_letter.remote(letter_id))

    def purge_dead_letters(
        self, *, identity: str | None = None, ids: Sequence[int] | None = None, before: float | None = None
    ) -> LedgerCall[int]:
        return _RayCall(self.actor.purge_dead_letters.remote(identity=identity, ids=ids, before=before))

    def register_host(
        self, *, name: str, holder: str, node: str | None = None, pid: int | None = None, process: str | None = None,
    ) -> LedgerCall[list[str]]:
        return _RayCall(self.actor.register_host.remote(name=name, holder=holder, node=node, pid=pid,
                                                         process=process))

    def remove_host(self, *, name: str, holder: str | None = None) -> LedgerCall[list[str]]:
        return _RayCall(self.actor.remove_host.remote(name=name, holder=holder))

    def set_host_draining(self, *, name: str, draining: bool) -> LedgerCall[None]:
        return _RayCall(self.actor.set_host_draining.remote(name=name, draining=draining))

    def hosts(self) -> LedgerCall[list[HostInfo]]:
        return _RayCall(self.actor.hosts.remote())
