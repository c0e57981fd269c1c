"""What a host answers a request with: ``(kind, payload)``.

A tuple of a kind string and a payload keeps the hot path free of class lookups; the
payload is the value for ``ok``, the owner's host name for ``redirect``, nothing for
``retry`` (this host cannot serve it now: route it again), and a pickle-safe
``RayfleetError`` for ``error`` (returned, not raised, so the caller gets the error
itself rather than Ray's wrapper).
"""

from __future__ import annotations

from typing import Any

OK = "ok"
REDIRECT = "redirect"
RETRY = "retry"
ERROR = "error"

Reply = tuple[str, Any]
