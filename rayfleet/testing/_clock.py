"""A clock that moves only when told to: deterministic leases, deadlines and budgets in tests."""

from __future__ import annotations


class ManualClock:
    """A callable clock (``clock() -> seconds``) for anything that takes ``clock=``.

    Starts at ``start`` and changes only through :meth:`advance` and :meth:`set`, so
    lease expiry, lock-delay and budgets can be tested without sleeping.
    """

    def __init__(self, start: float = 1_000.0) -> None:
        self.now = float(start)

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move forward by ``seconds`` (a negative value moves back: a clock jump)."""
        self.now += seconds

    def set(self, now: float) -> None:
        self.now = float(now)
