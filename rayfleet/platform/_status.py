"""How the ledger's record of an identity reads as the public ``IdentityStatus``."""

from __future__ import annotations

from ..errors import UnknownIdentityError
from ..identity._names import validate_identity
from ..identity._values import (
    PERSISTED_BROKEN,
    PERSISTED_RETIRED,
    Addressability,
    IdentityStatus,
    LeaseInfo,
    LifecycleState,
    lease_is_healthy,
)
from ..ledger._contract import LedgerClient
from ..ledger._values import IdentityView, holder_host


def identity_status(view: IdentityView) -> IdentityStatus:
    """The status of one identity: lifecycle state from its marker and lease, owner from the lease holder."""
    record, lease = view.continuity, view.lease
    if view.lifecycle == PERSISTED_RETIRED:
        state = LifecycleState.RETIRING
    elif view.lifecycle == PERSISTED_BROKEN:
        state = LifecycleState.BROKEN
    elif lease is not None:
        state = LifecycleState.ACTIVE
    elif record is None:
        state = LifecycleState.UNINITIALIZED
    else:
        state = LifecycleState.DORMANT
    return IdentityStatus(
        identity=view.identity,
        state=state,
        generation=None if record is None else record.generation,
        checkpoint_version=None if record is None or record.checkpoint_version == 0 else record.checkpoint_version,
        runtime_id=None if record is None else record.runtime_id,
        session_id=None if record is None else record.session_id,
        lease=None if lease is None else LeaseInfo(
            fencing_token=lease.fencing_token, ttl_remaining=lease.expires_in,
            healthy=lease_is_healthy(lease.ttl, lease.expires_in),
        ),
        host=None if lease is None else holder_host(lease.holder),
        agent_class=view.agent_class,
        labels=dict(view.labels),
        addressability=Addressability(view.addressability),
        paused=view.paused,
        broken_reason=view.reason if view.lifecycle == PERSISTED_BROKEN else "",
    )


def status_of(ledger: LedgerClient, identity: str) -> IdentityStatus:
    """The status of ``identity`` as the ledger records it now.

    Raises:
        UnknownIdentityError: no identity of that name exists.
    """
    return identity_status(view_of(ledger, identity))


def view_of(ledger: LedgerClient, identity: str) -> IdentityView:
    """The ledger's view of ``identity``.

    Raises:
        InvalidSpecError: ``identity`` is not a valid name.
        UnknownIdentityError: no identity of that name exists.
    """
    views = ledger.resolve([validate_identity(identity)]).result()
    if identity not in views:
        raise UnknownIdentityError(identity=identity)
    return views[identity]
