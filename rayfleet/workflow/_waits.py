"""Workflow steps that wait: for a person's approval, for a while, or for a signal (DESIGN §13).

A waiting step runs as a durable turn of a platform agent, the step's *waiter*
(:class:`WorkflowWaiter`), so it has everything a suspended turn has: it holds nothing on
any host while it waits, its approval is in the fleet's registry, its timeout is a durable
timer, and it survives its host. The engine dispatches it like any directed step, under a
key that stays the same for the run (``<run>/<label>/1-0``): when the runner restarts and
resumes the run, the re-sent step joins the turn that is still suspended instead of
asking again.

Waiters are named after the run: ``workflow/<run id>/step/<label>`` for an approval or a
sleep (one per step, so parallel waits of one run never queue behind each other), and
``workflow/<run id>/signal/<name>`` for a signal (one per name, so a signal can be sent
before the step that waits for it has started, and each signal is taken by one wait).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import InvalidSpecError
from ..identity._agent import Agent
from ..identity._handlers import handler
from ..identity._names import validate_identity

WaitKind = Literal["approval", "sleep", "signal"]
WAIT_METHOD = "wait"
"""The waiter's handler every waiting step calls."""
WAIT_SLACK = 60.0
"""Seconds the engine's dispatch of a waiting step outlasts the wait's own limit (the
turn's replay, its commit and the reply come after the limit is reached)."""
UNBOUNDED = 10 * 365 * 86400.0
"""The dispatch timeout of a wait without a limit (an approval with no timeout, a signal
that may take as long as it takes): ten years, bounded only by the workflow's budget."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Wait:
    """What a waiting step waits for.

    ``data`` of an approval may be a callable taking the step's
    :class:`~rayfleet.workflow._definition.StepContext` (earlier steps' outputs) and
    returning the data the approvers see.
    """

    kind: WaitKind
    seconds: float | None = None
    name: str | None = None
    subject: str = ""
    data: Any = None
    approvers: tuple[str, ...] = ()
    timeout: float | None = None
    on_timeout: str = "reject"

    def check(self, label: str) -> None:
        """Refuse a wait that could never run, naming the step and what to change.

        Raises:
            InvalidSpecError: a sleep that is not a finite number >= 0, an empty signal
                name or approval subject, approvers that are not names, a timeout not
                above 0, or an ``on_timeout`` other than reject or approve.
        """
        if self.kind == "sleep" and not (_seconds(self.seconds) and float(self.seconds or 0.0) >= 0):
            raise InvalidSpecError(f"step {label!r}: sleep needs a finite number of seconds >= 0, got "
                                   f"{self.seconds!r}", field=label)
        if self.kind == "signal" and (not isinstance(self.name, str) or not self.name):
            raise InvalidSpecError(f"step {label!r}: wait_signal needs the signal's name, got {self.name!r}",
                                   field=label)
        if self.kind == "approval":
            if not isinstance(self.subject, str) or not self.subject:
                raise InvalidSpecError(f"step {label!r}: an approval needs a subject (what is being approved)",
                                       field=label)
            if not all(isinstance(name, str) and name for name in self.approvers):
                raise InvalidSpecError(f"step {label!r}: approvers must be names, got {self.approvers!r}",
                                       field=label)
            if self.on_timeout not in ("reject", "approve"):
                raise InvalidSpecError(f"step {label!r}: on_timeout must be 'reject' or 'approve', got "
                                       f"{self.on_timeout!r}", field=label)
        if self.timeout is not None and (not _seconds(self.timeout) or self.timeout <= 0):
            raise InvalidSpecError(f"step {label!r}: timeout must be a number of seconds above 0, got "
                                   f"{self.timeout!r}", field=label)

    @property
    def data_builder(self) -> Callable[..., Any] | None:
        """The callable that builds an approval's data from earlier outputs, if that is what ``data`` is."""
        return self.data if self.kind == "approval" and callable(self.data) else None

    def dispatch_timeout(self) -> float:
        """How long the engine waits for the step: the wait's own limit and some slack, or :data:`UNBOUNDED`."""
        limit = self.seconds if self.kind == "sleep" else self.timeout
        return UNBOUNDED if limit is None else float(limit) + WAIT_SLACK

    def payload(self, *, run_id: str, label: str, data: Any) -> dict[str, Any]:
        """The waiter's keyword arguments for this wait (``data``: the approval's data, built)."""
        return {"kind": self.kind, "run_id": run_id, "label": label, "seconds": self.seconds, "name": self.name,
                "subject": self.subject, "data": data, "approvers": list(self.approvers),
                "timeout": self.timeout, "on_timeout": self.on_timeout}


def _seconds(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def waiter_identity(run_id: str, wait: Wait, label: str) -> str:
    """The identity of the agent that runs ``wait`` of step ``label`` of run ``run_id`` (see the module docstring)."""
    identity = (f"workflow/{run_id}/signal/{wait.name}" if wait.kind == "signal"
                else f"workflow/{run_id}/step/{label}")
    try:
        return validate_identity(identity)
    except InvalidSpecError:
        # A run id or a label with characters an identity cannot hold: a stable digest instead.
        return f"workflow/{hashlib.sha256(identity.encode()).hexdigest()[:32]}"


def waiter_runs(identity: str) -> list[str]:
    """The run ids that waiter ``identity`` can belong to, as :func:`waiter_identity` names it, shortest first.

    One, unless a run id holds ``/signal/`` or ``/step/`` itself (then each reading);
    none for a name that is not a waiter's, or a waiter named by its digest.
    """
    if not identity.startswith("workflow/"):
        return []
    rest = identity.removeprefix("workflow/")
    runs = []
    for separator in ("/signal/", "/step/"):
        at = rest.find(separator, 1)
        while at > 0:
            runs.append(rest[:at])
            at = rest.find(separator, at + 1)
    return sorted(runs, key=len)


def signal_waiter_identity(run_id: str, name: str) -> str:
    """The identity that a signal ``name`` for run ``run_id`` goes to (``fleet.signal_run``)."""
    return waiter_identity(run_id, Wait(kind="signal", name=name), "")


class WorkflowWaiter(Agent):
    """The platform agent that a workflow's waiting step runs on (one per step or signal name, see above).

    It keeps no State: the wait lives in its turn's journal, as any suspended turn's does.
    """

    @handler
    async def wait(self, *, kind: str, run_id: str, label: str, seconds: float | None = None,
                   name: str | None = None, subject: str = "", data: Any = None,
                   approvers: list[str] | None = None, timeout: float | None = None,
                   on_timeout: str = "reject") -> Any:
        """Wait as step ``label`` of run ``run_id`` asks: answers the approval's ``rf.Decision``, ``None``
        after a sleep, or the signal's value.

        Raises:
            WaitTimeoutError: a signal did not come within ``timeout``.
        """
        if kind == "sleep":
            await self.sleep(float(seconds or 0.0))
            return None
        if kind == "signal":
            return await self.wait_signal(str(name), timeout=timeout)
        return await self.approval(subject, data={"run": run_id, "step": label, "data": data},
                                   approvers=approvers or (), timeout=timeout, on_timeout=on_timeout)
