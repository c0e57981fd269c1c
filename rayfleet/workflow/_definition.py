"""Workflow definition values: budgets, selectors, gather policies, steps and the builder."""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

import cloudpickle

from .._version import VERSION
from ..errors import BudgetExceededError, InvalidSpecError, RayfleetError
from ..identity._names import validate_identity
from ..retry import RetryPolicy
from ._waits import WAIT_METHOD, Wait

Decision = Literal["done", "failed", "wait"]
OnTimeout = Literal["fail", "reassign"]

DEFAULT_STEP_TIMEOUT = 30.0
DEFAULT_PARALLELISM = 8
MAX_REASSIGNMENTS = 2
"""Reassignments after the first dispatch of an ``on_timeout("reassign")`` step."""


def _positive_number(value: object, *, integer: bool) -> bool:
    # bool is an int subclass; Budget(invocations=True) is a bug, not a ceiling of 1.
    if isinstance(value, bool):
        return False
    if integer:
        return isinstance(value, int) and value > 0
    return isinstance(value, (int, float)) and value > 0


# --------------------------------------------------------------------------- budgets


@dataclass(frozen=True, slots=True, kw_only=True)
class Budget:
    """Ceilings on what one ``run()`` may spend; ``None`` means unbounded.

    Attributes:
        invocations: steps dispatched (one per step, whatever its retries/reassignments).
        wall_clock: seconds since the run started (replay included).
        tokens: total tokens reported through ``Usage`` by step replies.

    Raises:
        InvalidSpecError: when a ceiling is not a positive number.
    """

    invocations: int | None = None
    wall_clock: float | None = None
    tokens: int | None = None

    def __post_init__(self) -> None:
        for name, integer in (("invocations", True), ("wall_clock", False), ("tokens", True)):
            value = getattr(self, name)
            if value is not None and not _positive_number(value, integer=integer):
                kind = "a positive integer" if integer else "a positive number of seconds"
                raise InvalidSpecError(
                    f"budget {name} must be {kind} or None, got {value!r}", field="budget"
                )


class BudgetMeter:
    """What a run has spent so far, checked against a :class:`Budget`.

    The meter is per ``run()`` call: a resumed run starts its counters and its wall
    clock again (replayed steps cost nothing).
    """

    def __init__(self, budget: Budget | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.budget = budget or Budget()
        self._clock = clock
        self.started: float = clock()
        self.invocations = 0
        self.tokens = 0

    def elapsed(self) -> float:
        """Seconds since the meter started."""
        return max(0.0, self._clock() - self.started)

    def charge_invocation(self) -> None:
        """Count one dispatched step."""
        self.invocations += 1

    def charge_tokens(self, n: int) -> None:
        """Add ``n`` tokens (negative counts are a dispatcher bug and are refused)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InvalidSpecError(f"token count must be a non-negative integer, got {n!r}", field="budget")
        self.tokens += n

    def check(self) -> None:
        """Raise on the first breached ceiling: invocations, then tokens, then wall clock.

        Reaching a ceiling exactly is allowed; only exceeding it is a breach.

        Raises:
            BudgetExceededError: ``budget`` names the dimension, ``ceiling`` and ``spent``
                are counts, tokens or seconds.
        """
        budget = self.budget
        if budget.invocations is not None and self.invocations > budget.invocations:
            raise BudgetExceededError(budget="invocations", ceiling=budget.invocations, spent=self.invocations)
        if budget.tokens is not None and self.tokens > budget.tokens:
            raise BudgetExceededError(budget="tokens", ceiling=budget.tokens, spent=self.tokens)
        if budget.wall_clock is not None:
            elapsed = self.elapsed()
            if elapsed > budget.wall_clock:
                raise BudgetExceededError(budget="wall_clock", ceiling=budget.wall_clock, spent=elapsed)

    def remaining_wall_clock(self) -> float | None:
        """Seconds left of the wall-clock budget (never negative), or ``None`` if unbounded."""
        if self.budget.wall_clock is None:
            return None
        return max(0.0, self.budget.wall_clock - self.elapsed())


# --------------------------------------------------------------------------- selectors and gathers


@dataclass(frozen=True, slots=True)
class Select:
    """Agents whose labels include every ``key: value`` pair given here.

    Raises:
        InvalidSpecError: when ``labels`` is empty or holds non-string keys/values.
    """

    labels: Mapping[str, str]

    def __post_init__(self) -> None:
        if not isinstance(self.labels, Mapping) or not self.labels:
            raise InvalidSpecError(
                "Select needs at least one label, e.g. Select({'skill': 'summarize'})", field="select"
            )
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in self.labels.items()):
            raise InvalidSpecError(f"Select labels must map strings to strings, got {dict(self.labels)!r}",
                                   field="select")
        # A read-only copy: the selector is a value and must not change under the engine.
        object.__setattr__(self, "labels", MappingProxyType(dict(self.labels)))

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.labels.items())))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Select) and dict(self.labels) == dict(other.labels)

    def __reduce__(self) -> Any:
        return (Select, (dict(self.labels),))


@dataclass(frozen=True, slots=True)
class AllOf:
    """Every selected agent must succeed; the first failure fails the step."""

    def decide(self, successes: int, failures: int, total: int) -> Decision:
        if failures:
            return "failed"
        return "done" if successes >= total else "wait"


@dataclass(frozen=True, slots=True)
class AnyOf:
    """The first success completes the step; it fails only when every agent failed."""

    def decide(self, successes: int, failures: int, total: int) -> Decision:
        if successes:
            return "done"
        return "failed" if failures >= total else "wait"


@dataclass(frozen=True, slots=True)
class FirstOf:
    """The first reply decides: a success completes the step, a failure fails it.

    The engine calls ``decide`` after each reply, so at the first decision only one of
    the counts is non-zero; if both are (a bulk call), the failure wins.
    """

    def decide(self, successes: int, failures: int, total: int) -> Decision:
        if failures:
            return "failed"
        return "done" if successes else "wait"


@dataclass(frozen=True, slots=True)
class Quorum:
    """``k`` successes complete the step; it fails as soon as ``k`` can no longer be reached.

    Raises:
        InvalidSpecError: when ``k`` is not an integer >= 1.
    """

    k: int

    def __post_init__(self) -> None:
        if not _positive_number(self.k, integer=True):
            raise InvalidSpecError(f"Quorum k must be an integer >= 1, got {self.k!r}", field="gather")

    def decide(self, successes: int, failures: int, total: int) -> Decision:
        if successes >= self.k:
            return "done"
        if total - failures < self.k:
            return "failed"
        return "wait"


GatherPolicy = AllOf | AnyOf | FirstOf | Quorum
_GATHER_TYPES = (AllOf, AnyOf, FirstOf, Quorum)


# --------------------------------------------------------------------------- steps


@dataclass(frozen=True, slots=True)
class AgentFailure:
    """In a scatter step's output, an agent that failed (its error text) instead of an output."""

    error: str


@dataclass(frozen=True, slots=True, kw_only=True)
class StepContext:
    """What a payload builder sees: the run, prior outputs (read-only) and the attempt (1-based)."""

    run_id: str
    outputs: Mapping[str, Any]
    attempt: int = 1


PayloadBuilder = Callable[[StepContext], Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    """One step of a workflow: whom to call, with what, after which steps, and how.

    Per-step invariants are checked here; cross-step ones (dependencies, cycles,
    exclusivity) in :meth:`Workflow.validate`.

    Raises:
        InvalidSpecError: naming the step and what to change.
    """

    label: str
    call: str
    to: str | None = None
    select: Select | None = None
    scatter: Select | None = None
    payload: PayloadBuilder | Mapping[str, Any] | None = None
    after: tuple[str, ...] = ()
    gather: GatherPolicy = field(default_factory=AllOf)
    timeout: float = DEFAULT_STEP_TIMEOUT
    per_agent_timeout: float | None = None
    retry: RetryPolicy = field(default_factory=lambda: RetryPolicy(max_attempts=1))
    on_timeout: OnTimeout = "fail"
    exclusive: bool = False
    verifier: Callable[[Any], Any] | None = None
    compensation: str | None = None
    compensation_payload: PayloadBuilder | None = None
    wait: Wait | None = None
    """Set on a waiting step (``Workflow.approval``, ``sleep``, ``wait_signal``): it has no target of its own."""

    def __post_init__(self) -> None:
        label = self.label
        if not isinstance(label, str) or not label:
            raise InvalidSpecError(f"step label must be a non-empty string, got {label!r}", field="step")
        targets = [name for name in ("to", "select", "scatter") if getattr(self, name) is not None]
        if self.wait is not None:
            self._check_wait(targets)
        elif len(targets) != 1:
            given = ", ".join(targets) or "none"
            raise InvalidSpecError(
                f"step {label!r} needs exactly one of to=, select= or scatter= (given: {given}); "
                f"keep the one that names who should run it",
                field=label,
            )
        if self.to is not None:
            try:
                validate_identity(self.to)
            except InvalidSpecError as error:
                raise InvalidSpecError(f"step {label!r} has an invalid to=: {error}", field=label) from None
        for name in ("select", "scatter"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, Select):
                raise InvalidSpecError(f"step {label!r}: {name}= must be a Select(...), got {value!r}",
                                       field=label)
        if not isinstance(self.call, str) or not self.call.isidentifier():
            raise InvalidSpecError(f"step {label!r}: call= must be a handler name, got {self.call!r}", field=label)
        if self.payload is not None and not (callable(self.payload) or isinstance(self.payload, Mapping)):
            raise InvalidSpecError(
                f"step {label!r}: payload= must be a dict or a callable(ctx) returning a dict, got "
                f"{type(self.payload).__name__}",
                field=label,
            )
        if isinstance(self.after, str) or not all(isinstance(dep, str) for dep in self.after):
            raise InvalidSpecError(f"step {label!r}: after= must be a tuple of step labels, got {self.after!r}",
                                   field=label)
        object.__setattr__(self, "after", tuple(self.after))
        if not isinstance(self.gather, _GATHER_TYPES):
            raise InvalidSpecError(f"step {label!r}: gather= must be AllOf(), AnyOf(), FirstOf() or Quorum(k), "
                                   f"got {self.gather!r}", field=label)
        for name in ("timeout", "per_agent_timeout"):
            value = getattr(self, name)
            if value is not None and not _positive_number(value, integer=False):
                raise InvalidSpecError(f"step {label!r}: {name} must be a positive number of seconds, got {value!r}",
                                       field=label)
        if self.timeout is None:
            raise InvalidSpecError(f"step {label!r}: timeout must be a positive number of seconds", field=label)
        if not isinstance(self.retry, RetryPolicy):
            raise InvalidSpecError(f"step {label!r}: retry must be a RetryPolicy, got {self.retry!r}", field=label)
        if self.on_timeout not in ("fail", "reassign"):
            raise InvalidSpecError(f"step {label!r}: on_timeout must be 'fail' or 'reassign', got {self.on_timeout!r}",
                                   field=label)
        if self.verifier is not None and not callable(self.verifier):
            raise InvalidSpecError(f"step {label!r}: a verifier must be callable(output) -> bool", field=label)
        if self.compensation is not None and (not isinstance(self.compensation, str)
                                              or not self.compensation.isidentifier()):
            raise InvalidSpecError(f"step {label!r}: compensate() needs a handler name, got {self.compensation!r}",
                                   field=label)
        if self.compensation_payload is not None and not callable(self.compensation_payload):
            raise InvalidSpecError(f"step {label!r}: a compensation payload must be callable(ctx) -> dict",
                                   field=label)

    def _check_wait(self, targets: list[str]) -> None:
        assert self.wait is not None
        if not isinstance(self.wait, Wait):
            raise InvalidSpecError(f"step {self.label!r}: wait= must be a Wait, got {self.wait!r}", field=self.label)
        self.wait.check(self.label)
        refused = [name for name, given in (
            ("a target", bool(targets)), ("a payload", self.payload is not None),
            ("a verifier", self.verifier is not None), ("a compensation", self.compensation is not None),
            ("an exclusive lease", self.exclusive),
            ("retries", isinstance(self.retry, RetryPolicy) and self.retry.max_attempts != 1),
            ("reassignment on timeout", self.on_timeout != "fail"),
        ) if given]
        if refused:
            raise InvalidSpecError(
                f"step {self.label!r} waits ({self.wait.kind}); it cannot have {', '.join(refused)}: a waiting step "
                f"runs on its own platform agent, once; put those on the steps before or after it", field=self.label)

    @property
    def target(self) -> str | Select:
        """The single ``to`` identity or the step's selector."""
        return self.to if self.to is not None else (self.select or self.scatter)  # type: ignore[return-value]

    @property
    def is_scatter(self) -> bool:
        return self.scatter is not None

    def callables(self) -> dict[str, Callable[..., Any]]:
        """The user callables a submitted run must ship: payload builder, verifier, compensation payload."""
        found: dict[str, Callable[..., Any]] = {}
        if callable(self.payload):
            found["payload builder"] = self.payload
        if self.verifier is not None:
            found["verifier"] = self.verifier
        if self.compensation_payload is not None:
            found["compensation payload"] = self.compensation_payload
        if self.wait is not None and self.wait.data_builder is not None:
            found["approval data builder"] = self.wait.data_builder
        return found


class StepHandle:
    """Chainable options for a step already added to a workflow.

    Steps are immutable: each method replaces the workflow's step with an updated
    copy (so a rejected option leaves the previous step in place) and returns the handle.
    """

    __slots__ = ("_workflow", "label")

    def __init__(self, workflow: Workflow, label: str) -> None:
        self._workflow = workflow
        self.label = label

    @property
    def step(self) -> Step:
        """The step as currently defined."""
        return self._workflow._steps[self.label]

    def _replace(self, **changes: Any) -> StepHandle:
        self._workflow._steps[self.label] = dataclasses.replace(self.step, **changes)
        return self

    def compensate(self, method: str, payload: PayloadBuilder | None = None) -> StepHandle:
        """Undo this step with handler ``method`` when a later step fails.

        ``payload(ctx)`` builds its arguments (``ctx.outputs[label]`` is this step's
        output); by default the output itself if it is a dict, else ``{"output": output}``.
        """
        return self._replace(compensation=method, compensation_payload=payload)

    def exclusive(self) -> StepHandle:
        """Dispatch under the run's fenced lease, on the pinned conversation ``run_id/label``."""
        return self._replace(exclusive=True)

    def verify(self, fn: Callable[[Any], Any]) -> StepHandle:
        """Fail the step unless ``fn(output)`` returns a true value (a raising verifier fails it too)."""
        return self._replace(verifier=fn)

    def retry(self, policy: RetryPolicy) -> StepHandle:
        """Retry retryable dispatch errors (timeouts, connection errors, ``rf.RetryableError``) per ``policy``."""
        return self._replace(retry=policy)

    def timeout(self, seconds: float) -> StepHandle:
        """Seconds allowed per dispatch."""
        return self._replace(timeout=seconds)

    def on_timeout(self, action: OnTimeout) -> StepHandle:
        """``"fail"`` (default) or ``"reassign"`` to another capable agent (exclusive steps only)."""
        return self._replace(on_timeout=action)

    def __repr__(self) -> str:
        return f"StepHandle({self.label!r})"


# --------------------------------------------------------------------------- workflow


class Workflow:
    """A named DAG of steps with an optional budget and a cap on concurrent steps.

    Raises:
        InvalidSpecError: when ``name`` is not a valid identity (it is the sender of
            every step) or ``parallelism`` is not an integer >= 1.
    """

    def __init__(self, name: str, *, budget: Budget | None = None, parallelism: int = DEFAULT_PARALLELISM) -> None:
        try:
            validate_identity(name)
        except InvalidSpecError as error:
            raise InvalidSpecError(f"workflow name is not valid: {error}", field="workflow") from None
        if not _positive_number(parallelism, integer=True):
            raise InvalidSpecError(f"workflow {name!r}: parallelism must be an integer >= 1, got {parallelism!r}",
                                   field=name)
        if budget is not None and not isinstance(budget, Budget):
            raise InvalidSpecError(f"workflow {name!r}: budget must be a Budget(...), got {budget!r}", field=name)
        self.name = name
        self.budget = budget
        self.parallelism = parallelism
        self._steps: dict[str, Step] = {}

    @property
    def steps(self) -> Mapping[str, Step]:
        """Steps by label, in insertion order (read-only)."""
        return MappingProxyType(self._steps)

    def step(
        self,
        label: str,
        *,
        to: str | None = None,
        select: Select | None = None,
        scatter: Select | None = None,
        call: str,
        payload: PayloadBuilder | Mapping[str, Any] | None = None,
        after: Iterable[str] | str = (),
        gather: GatherPolicy | None = None,
        timeout: float = DEFAULT_STEP_TIMEOUT,
        per_agent_timeout: float | None = None,
        retry: RetryPolicy | None = None,
    ) -> StepHandle:
        """Add a step and return a handle for its chainable options.

        Raises:
            InvalidSpecError: at once for a duplicate label or a malformed step.
        """
        return self._add(
            label, after, to=to, select=select, scatter=scatter, call=call, payload=payload,
            gather=gather if gather is not None else AllOf(), timeout=timeout, per_agent_timeout=per_agent_timeout,
            retry=retry if retry is not None else RetryPolicy(max_attempts=1),
        )

    def approval(
        self, label: str, *, subject: str, data: Any = None, approvers: Iterable[str] = (),
        after: Iterable[str] | str = (), timeout: float | None = None, on_timeout: str = "reject",
    ) -> StepHandle:
        """Add a step that waits for a person's decision on ``subject``; its output is the ``rf.Decision``.

        The request appears in the fleet's approvals registry (``fleet.approvals``,
        ``rayfleet approvals``, ``/v1/approvals``) with ``{"run": run_id, "step": label,
        "data": data}``; ``data`` may be a callable taking the step context (earlier
        outputs). A rejection fails the step, so the run compensates what it did. After
        ``timeout`` seconds the timeout decides it (``on_timeout``: reject or approve).
        The wait is a durable turn: it holds nothing while waiting and survives a runner
        restart (the resumed run waits for the same request).

        Raises:
            InvalidSpecError: at once for a duplicate label, an empty subject, bad
                approvers, timeout or ``on_timeout``.
        """
        return self._wait(label, after, Wait(kind="approval", subject=subject, data=data,
                                             approvers=_names(label, approvers), timeout=timeout,
                                             on_timeout=on_timeout))

    def sleep(self, label: str, seconds: float, *, after: Iterable[str] | str = ()) -> StepHandle:
        """Add a step that waits ``seconds`` durably (the run holds no host meanwhile); its output is ``None``.

        The wake time is fixed when the step first starts: a resumed run waits only for
        what is left.

        Raises:
            InvalidSpecError: at once for a duplicate label or ``seconds`` not a finite number >= 0.
        """
        return self._wait(label, after, Wait(kind="sleep", seconds=seconds))

    def wait_signal(self, label: str, name: str, *, after: Iterable[str] | str = (),
                    timeout: float | None = None) -> StepHandle:
        """Add a step that waits for signal ``name`` sent to the run (``fleet.signal_run(run_id, name, value)``).

        Its output is the signal's value. A signal sent before the step starts is kept
        until it does; each signal is taken by one wait. A ``timeout`` (seconds from
        the step's start) that passes first fails the step.

        Raises:
            InvalidSpecError: at once for a duplicate label, an empty name or a bad timeout.
        """
        return self._wait(label, after, Wait(kind="signal", name=name, timeout=timeout))

    def _wait(self, label: str, after: Iterable[str] | str, wait: Wait) -> StepHandle:
        return self._add(label, after, call=WAIT_METHOD, wait=wait, timeout=wait.dispatch_timeout())

    def _add(self, label: str, after: Iterable[str] | str, **fields: Any) -> StepHandle:
        if not isinstance(label, str) or not label:
            raise InvalidSpecError(f"step label must be a non-empty string, got {label!r}", field="step")
        if label in self._steps:
            raise InvalidSpecError(
                f"workflow {self.name!r} already has a step {label!r}; give each step a unique label",
                field=label,
            )
        try:
            after_tuple = (after,) if isinstance(after, str) else tuple(after)
        except TypeError:
            raise InvalidSpecError(
                f"step {label!r}: after= must be a step label or a list of them, got {after!r}", field=label
            ) from None
        self._steps[label] = Step(label=label, after=after_tuple, **fields)
        return StepHandle(self, label)

    def validate(self, *, for_submit: bool = False) -> None:
        """Check the whole definition before anything is dispatched.

        Args:
            for_submit: also require every payload builder, verifier and compensation
                payload to pickle with cloudpickle (a submitted run ships them).

        Raises:
            InvalidSpecError: naming the step and the fix, for an unknown dependency, a
                cycle, an exclusive scatter, ``reassign`` without ``exclusive()``, an
                invalid ``to`` identity, or (``for_submit``) an unpicklable callable.
        """
        for step in self._steps.values():
            # Steps may be built directly, so re-check what __post_init__ checks cheaply.
            if step.to is not None:
                try:
                    validate_identity(step.to)
                except InvalidSpecError as error:
                    raise InvalidSpecError(f"step {step.label!r} has an invalid to=: {error}",
                                           field=step.label) from None
            for dep in step.after:
                if dep not in self._steps:
                    raise InvalidSpecError(
                        f"step {step.label!r} depends on unknown step {dep!r}; add that step or fix after=",
                        field=step.label,
                    )
            if step.exclusive and step.scatter is not None:
                raise InvalidSpecError(
                    f"step {step.label!r} is exclusive but scatters to every matching agent; an exclusive step "
                    f"needs one holder, so use to= or select=, or drop .exclusive()",
                    field=step.label,
                )
            if step.on_timeout == "reassign" and not step.exclusive:
                raise InvalidSpecError(
                    f"step {step.label!r} reassigns on timeout but is not exclusive; add .exclusive() so the "
                    f"reassignment bumps the fence and gates out the timed-out holder",
                    field=step.label,
                )
        self.order()  # raises on a cycle
        if for_submit:
            for step in self._steps.values():
                for what, fn in step.callables().items():
                    try:
                        cloudpickle.dumps(fn)
                    except Exception as error:  # noqa: BLE001 - cloudpickle raises many types for unpicklable state
                        raise InvalidSpecError(
                            f"step {step.label!r}: its {what} cannot be pickled for submission "
                            f"({type(error).__name__}: {error}); capture only picklable values in it, "
                            f"or run the workflow in-process",
                            field=step.label,
                        ) from None

    def order(self) -> list[str]:
        """Labels in a deterministic topological order.

        Kahn's algorithm with a FIFO queue seeded in insertion order, so independent
        steps keep their authored order (``a``, ``b after a``, ``c`` gives ``a, c, b``).

        Raises:
            InvalidSpecError: for an unknown dependency or a cycle (naming its steps).
        """
        indegree = dict.fromkeys(self._steps, 0)
        dependents: dict[str, list[str]] = {label: [] for label in self._steps}
        for step in self._steps.values():
            for dep in dict.fromkeys(step.after):  # a repeated dependency is one edge
                if dep not in self._steps:
                    raise InvalidSpecError(
                        f"step {step.label!r} depends on unknown step {dep!r}; add that step or fix after=",
                        field=step.label,
                    )
                indegree[step.label] += 1
                dependents[dep].append(step.label)
        ready = deque(label for label, degree in indegree.items() if degree == 0)
        result: list[str] = []
        while ready:
            label = ready.popleft()
            result.append(label)
            for dependent in dependents[label]:
                indegree[dependent] -= 1
                if indegree[dependent] == 0:
                    ready.append(dependent)
        if len(result) != len(self._steps):
            cycle = self._find_cycle({label for label, degree in indegree.items() if degree > 0})
            raise InvalidSpecError(
                f"workflow {self.name!r} has a dependency cycle: {' -> '.join(cycle)}; "
                f"remove one of these after= links",
                field=cycle[0],
            )
        return result

    def _find_cycle(self, remaining: set[str]) -> list[str]:
        # Every remaining node has a remaining dependency, so following them must loop.
        start = min(remaining, key=list(self._steps).index)
        path: list[str] = []
        seen: dict[str, int] = {}
        node = start
        while node not in seen:
            seen[node] = len(path)
            path.append(node)
            node = next(dep for dep in self._steps[node].after if dep in remaining)
        cycle = path[seen[node]:]
        cycle.reverse()  # present as "a -> b": a runs before b
        declared = list(self._steps)
        first = min(range(len(cycle)), key=lambda i: declared.index(cycle[i]))
        cycle = cycle[first:] + cycle[:first]  # start at the earliest declared step, for stable messages
        return [*cycle, cycle[0]]

    def code_version(self) -> str:
        """A hash of the definition, stable across calls and processes for the same definition.

        Covers labels, targets, calls, dependencies, options, gather policies, budget,
        compensations, the cloudpickled bytes of callables (their qualnames when they do
        not pickle) and the installed rayfleet version.
        """
        digest = hashlib.sha256()

        def feed(*parts: object) -> None:
            for part in parts:
                data = part if isinstance(part, bytes) else repr(part).encode()
                digest.update(len(data).to_bytes(8, "big"))
                digest.update(data)

        feed("rayfleet", VERSION, self.name, self.parallelism, self.budget)
        for step in self._steps.values():
            feed(
                step.label, step.call, step.to,
                None if step.select is None else sorted(step.select.labels.items()),
                None if step.scatter is None else sorted(step.scatter.labels.items()),
                step.after, step.gather, step.timeout, step.per_agent_timeout, step.retry, step.on_timeout,
                step.exclusive, step.compensation,
                None if step.wait is None else dataclasses.replace(step.wait, data=None),
            )
            if step.wait is not None and step.wait.data_builder is None:
                feed("wait-data", step.wait.data)
            if isinstance(step.payload, Mapping):
                feed("payload-dict", sorted(step.payload.items(), key=lambda item: str(item[0])))
            for what, fn in sorted(step.callables().items()):
                feed(what, _callable_fingerprint(fn))
        return digest.hexdigest()

    def __repr__(self) -> str:
        return f"Workflow({self.name!r}, steps={list(self._steps)!r})"


def _names(label: str, approvers: Iterable[str]) -> tuple[str, ...]:
    if isinstance(approvers, str):
        raise InvalidSpecError(f"step {label!r}: approvers must be a list of names, got the string {approvers!r}",
                               field=label)
    return tuple(approvers)


def _callable_fingerprint(fn: Callable[..., Any]) -> bytes:
    try:
        pickled: bytes = cloudpickle.dumps(fn)
        return pickled
    except Exception:  # noqa: BLE001 - an unpicklable callable is still identified by where it is defined
        return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(type(fn)))}".encode()


# --------------------------------------------------------------------------- outcomes


class RunStatus(str, enum.Enum):
    """Where a run is in its life."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    PAUSED = "PAUSED"
    COMPLETED = "COMPLETED"
    COMPENSATED = "COMPENSATED"
    """A step failed and every compensation succeeded."""
    FAILED = "FAILED"
    """A step failed and at least one compensation failed too."""
    CANCELLED = "CANCELLED"


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkflowOutcome:
    """The result of one ``run()``: status, outputs, what was compensated and why it failed.

    ``outputs`` holds every journaled output (replayed ones included) in topological
    order. ``compensation_errors`` maps a step label to why its compensation failed.
    """

    run_id: str
    status: RunStatus
    outputs: dict[str, Any] = field(default_factory=dict)
    compensated: tuple[str, ...] = ()
    error: RayfleetError | None = None
    usage_tokens: int = 0
    invocations: int = 0
    compensation_errors: Mapping[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status is RunStatus.COMPLETED

    def raise_error(self) -> None:
        """Raise :attr:`error` if the run failed; return ``None`` otherwise."""
        if self.error is not None:
            raise self.error
