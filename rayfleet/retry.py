"""Retry policy: the one description of how rayfleet backs off and tries again."""

from __future__ import annotations

import random
from dataclasses import dataclass

from .errors import InvalidSpecError


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """How a host retries a handler that raised a retryable error."""

    max_attempts: int = 5
    """Attempts in all, the first included (at least 1)."""
    base_delay: float = 0.2
    """Seconds before the second attempt; doubles after each attempt."""
    max_delay: float = 5.0
    """Cap on any one delay."""
    jitter: float = 0.2
    """Each delay is multiplied by a random factor in [1 - jitter, 1 + jitter]."""

    def __post_init__(self) -> None:
        if not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise InvalidSpecError(f"retry max_attempts must be an integer >= 1, got {self.max_attempts!r}",
                                   subject="retry")
        if self.base_delay < 0 or self.max_delay < self.base_delay:
            raise InvalidSpecError(
                f"retry delays must satisfy 0 <= base_delay <= max_delay, got {self.base_delay!r}, {self.max_delay!r}",
                subject="retry",
            )
        if not 0 <= self.jitter < 1:
            raise InvalidSpecError(f"retry jitter must be in [0, 1), got {self.jitter!r}", subject="retry")

    def delay_for(self, attempt: int, *, rng: random.Random | None = None) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (0-based)."""
        raw = min(self.base_delay * 2**attempt, self.max_delay)
        spread = (rng or random).uniform(1 - self.jitter, 1 + self.jitter) if self.jitter else 1.0
        return min(raw * spread, self.max_delay)
