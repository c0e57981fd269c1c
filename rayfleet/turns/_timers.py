"""Reminders and schedules as an agent writes them and a host fires them: validation, next times, firings.

The registry is the ledger's (``rayfleet.ledger._timers``). Each firing is a message to
the identity with the idempotency key ``timer:<name>:<scheduled time>``, so it takes
effect once per scheduled time even when two hosts fire it (a claim lapsed) or a host
dies between the firing and its settlement. Cron expressions are read with ``croniter``
in the schedule's time zone (``zoneinfo``), so a daily 08:00 stays at 08:00 across
daylight-saving changes.
"""

from __future__ import annotations

import datetime
import math
import pickle
import zoneinfo
from typing import Any

import cloudpickle
from croniter import CroniterBadCronError, CroniterBadDateError, CroniterNotAlphaError, croniter

from ..errors import UsageError
from ..ledger._turn_rows import TimerFired, TimerRow, TimerSpec
from ._values import TimerInfo

OVERLAP = ("skip", "allow")
CATCH_UP = ("latest", "all", "none")
LATE_AFTER = 2.0
"""A firing more than this many seconds after its scheduled time counts as late."""
CATCH_UP_LIMIT = 100_000
"""Scheduled times one settlement steps over at most (a schedule every minute, down for ~70 days)."""


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _method(api: str, method: object) -> str:
    if not isinstance(method, str) or not method.isidentifier():
        raise UsageError(f"{api}(method=) must name a handler of this agent, got {method!r}", api=api)
    return method


def _name(api: str, name: object) -> str:
    if not isinstance(name, str) or not name or len(name) > 200:
        raise UsageError(f"{api}(name) needs a name of 1 to 200 characters, got {name!r}", api=api)
    return name


def _payload(api: str, payload: dict[str, Any]) -> bytes:
    try:
        return bytes(cloudpickle.dumps(payload))
    except Exception as error:
        raise UsageError(f"{api}: the handler's arguments cannot be stored: {type(error).__name__}: {error}",
                         api=api) from error


def reminder(name: str, *, method: str, payload: dict[str, Any], at: float | None, after: float | None,
             every: float | None, now: float) -> TimerSpec:
    """A reminder: once ``at`` a time or ``after`` seconds, or ``every`` seconds.

    A periodic reminder first fires at ``at`` or after ``after`` if given, else ``every``
    seconds from now.

    Raises:
        UsageError: naming what is wrong (no time given, both ``at`` and ``after``, a time
            in the past, a period not above 0, a method that is not a handler name).
    """
    api = "self.remind"
    _name(api, name)
    if at is not None and after is not None:
        raise UsageError("self.remind takes at= or after=, not both", api=api)
    if at is None and after is None and every is None:
        raise UsageError("self.remind needs a time: at= (time.time() seconds), after= (seconds) or every= (seconds)",
                         api=api)
    if every is not None and (not _number(every) or every <= 0):
        raise UsageError(f"self.remind(every=) must be a number of seconds above 0, got {every!r}", api=api)
    if after is not None and (not _number(after) or after < 0):
        raise UsageError(f"self.remind(after=) must be a number of seconds >= 0, got {after!r}", api=api)
    if at is not None:
        if not _number(at):
            raise UsageError(f"self.remind(at=) must be a time.time() value, got {at!r}", api=api)
        if at < now - 1.0:
            raise UsageError(f"self.remind(at={at!r}) is {now - at:.1f} s in the past; give a future time, or "
                             f"after=0 to fire now", api=api)
    first = at if at is not None else now + after if after is not None else now + (every or 0.0)
    return TimerSpec(name=name, method=_method(api, method), payload=_payload(api, payload), next_due=first,
                     every=every)


def schedule(name: str, *, cron: str, tz: str, method: str, payload: dict[str, Any], overlap: str, catch_up: str,
             now: float) -> TimerSpec:
    """A cron schedule in time zone ``tz``; its first time is the first one after ``now``.

    Raises:
        UsageError: a bad cron expression or time zone, an unknown overlap or catch-up policy.
    """
    api = "self.schedule"
    _name(api, name)
    zone = _zone(tz)
    if overlap not in OVERLAP:
        raise UsageError(f"self.schedule(overlap=) must be one of {', '.join(map(repr, OVERLAP))}, got {overlap!r}",
                         api=api)
    if catch_up not in CATCH_UP:
        raise UsageError(f"self.schedule(catch_up=) must be one of {', '.join(map(repr, CATCH_UP))}, got "
                         f"{catch_up!r}", api=api)
    if not isinstance(cron, str) or not croniter.is_valid(cron):
        raise UsageError(f"self.schedule(cron={cron!r}) is not a cron expression; e.g. '0 8 * * 1-5' (08:00 on "
                         f"weekdays), '*/15 * * * *' (every 15 minutes)", api=api)
    return TimerSpec(name=name, method=_method(api, method), payload=_payload(api, payload),
                     next_due=_next_cron(cron, zone, now), cron=cron, tz=tz, overlap=overlap, catch_up=catch_up)


def _zone(tz: str) -> zoneinfo.ZoneInfo:
    try:
        return zoneinfo.ZoneInfo(tz)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, TypeError):
        raise UsageError(f"self.schedule(tz={tz!r}) is not a time zone; use an IANA name such as 'Europe/Paris' "
                         f"or 'UTC'", api="self.schedule") from None


def _next_cron(cron: str, zone: zoneinfo.ZoneInfo, after: float) -> float:
    start = datetime.datetime.fromtimestamp(after, zone)
    try:
        following: datetime.datetime = croniter(cron, start).get_next(datetime.datetime)
    except (CroniterBadCronError, CroniterBadDateError, CroniterNotAlphaError) as error:
        raise UsageError(f"self.schedule(cron={cron!r}) has no next time: {error}", api="self.schedule") from None
    return following.timestamp()


def next_time(row: TimerRow, after: float) -> float | None:
    """The timer's first scheduled time after ``after`` (``None`` for a one-off reminder)."""
    if row.cron:
        return _next_cron(row.cron, zoneinfo.ZoneInfo(row.tz or "UTC"), after)
    if row.every is not None:
        return after + row.every
    return None


def settlement(row: TimerRow, *, now: float) -> TimerFired:
    """What firing ``row`` for its scheduled time ``row.next_due`` leaves: its next time, and the times missed.

    The next time is the one after the scheduled time. Times that passed already are
    handled by the catch-up policy: ``all`` keeps the next one (each fires in turn),
    ``latest`` moves to the latest that passed (it fires at once; the ones before it are
    missed), ``none`` moves past now (every one that passed is missed).
    """
    scheduled = row.next_due
    lateness = max(0.0, now - scheduled)
    following = next_time(row, scheduled)
    missed = 0
    if following is not None and row.catch_up != "all":
        passed: list[float] = []
        while following is not None and following <= now and len(passed) < CATCH_UP_LIMIT:
            passed.append(following)
            following = next_time(row, following)
        if passed and row.catch_up == "latest":
            following = passed.pop()
        missed = len(passed)
    return TimerFired(identity=row.identity, name=row.name, scheduled=scheduled, next_due=following, missed=missed,
                      lateness=lateness, late=lateness > LATE_AFTER)


def timer_info(row: TimerRow) -> TimerInfo:
    return TimerInfo(identity=row.identity, name=row.name, method=row.method, payload=pickle.loads(row.payload),
                     next_due=row.next_due, every=row.every, cron=row.cron, tz=row.tz, overlap=row.overlap,
                     catch_up=row.catch_up, created=row.created, last_fired=row.last_fired, fired=row.fired,
                     missed=row.missed, late=row.late, last_lateness=row.last_lateness)
