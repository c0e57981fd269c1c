"""``GatewayLimits``: the sizes and times an HTTP client may ask of the gateway."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import InvalidSpecError


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewayLimits:
    """Bounds on what one HTTP request may ask for; every field has a default.

    Requests beyond a bound are refused before any work is done (413 for a body, 400
    otherwise), so one client cannot make the gateway or the fleet hold unbounded data.

    Raises:
        InvalidSpecError: a bound is not a positive number, or a default exceeds its maximum.
    """

    max_body_bytes: int = 1024 * 1024
    """Largest request body accepted (1 MiB); a larger one is answered 413."""
    max_idempotency_key_length: int = 200
    """Longest ``Idempotency-Key`` header accepted."""
    default_timeout: float = 30.0
    """Seconds a call or replay waits for its reply when the request names no ``timeout``."""
    max_timeout: float = 300.0
    """Largest ``timeout`` a request may name."""
    default_page_size: int = 100
    """Items per page of a listing when the request names no ``limit``."""
    max_page_size: int = 1000
    """Largest ``limit`` a listing request may name."""
    sse_heartbeat: float = 15.0
    """Seconds between keep-alive comments on an idle event stream (they also detect gone clients)."""

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_idempotency_key_length", "default_page_size", "max_page_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidSpecError(f"GatewayLimits.{name} must be a positive integer, got {value!r}", field=name)
        for name in ("default_timeout", "max_timeout", "sse_heartbeat"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise InvalidSpecError(f"GatewayLimits.{name} must be a positive number of seconds, got {value!r}",
                                       field=name)
        if self.default_timeout > self.max_timeout:
            raise InvalidSpecError(
                f"GatewayLimits.default_timeout ({self.default_timeout:g}) exceeds max_timeout ({self.max_timeout:g})",
                field="default_timeout",
            )
        if self.default_page_size > self.max_page_size:
            raise InvalidSpecError(
                f"GatewayLimits.default_page_size ({self.default_page_size}) exceeds max_page_size "
                f"({self.max_page_size})",
                field="default_page_size",
            )
