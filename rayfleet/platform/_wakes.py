"""Delivering the wake of a suspended turn from a driver (a signal sent, an approval decided)."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from ..host._messages import wake_envelope
from ..ledger._turn_rows import TurnWake
from ._routing import Courier, deliver_request

log = logging.getLogger("rayfleet.wakes")

WAKE_TIMEOUT = 30.0
"""Seconds a driver waits for a woken turn's owner to take the wake (it resumes the turn in the
background); past that, the turn is left due for the hosts' wake sweep."""


def deliver_wakes(courier: Courier, wakes: Iterable[TurnWake]) -> None:
    """Hand each woken turn to its identity's owner (activating it anywhere). Never raises.

    The ledger already made each turn due, so a wake that cannot be delivered now is
    delivered by a host's wake sweep; a turn woken twice resumes once.
    """
    for wake in wakes:
        envelope = wake_envelope(wake)
        try:
            courier.route_sync(wake.identity, deliver_request(envelope), method=envelope.method, timeout=WAKE_TIMEOUT)
        except Exception as error:  # noqa: BLE001 - see the docstring
            log.info("the wake of turn %s of %s is left to the wake sweep: %s", wake.turn_id, wake.identity, error)
