"""Who may use the gateway: the bearer-token check, and the rule for starting without a token."""

from __future__ import annotations

import hmac
import ipaddress

from ..errors import UsageError

TOKEN_ENV = "RAYFLEET_GATEWAY_TOKEN"
LOOPBACK_NAMES = frozenset({"localhost"})


def bearer_token_matches(authorization: str | None, token: str) -> bool:
    """Whether an ``Authorization`` header value carries exactly ``token`` as a bearer token.

    The comparison takes the same time wherever the two differ (``hmac.compare_digest``),
    so response timing tells an attacker nothing about how much of a guess was right.
    The scheme is matched case-insensitively, as RFC 7235 asks.
    """
    if not authorization:
        return False
    scheme, _, presented = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    # Bytes, so a header with non-ASCII characters is compared too rather than raising.
    return hmac.compare_digest(presented.strip().encode("utf-8", "surrogateescape"),
                               token.encode("utf-8", "surrogateescape"))


def is_loopback(host: str) -> bool:
    """Whether ``host`` names only this machine (``127.0.0.0/8``, ``::1`` or ``localhost``)."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_startup(*, host: str, token: str | None, insecure: bool) -> None:
    """Refuse a gateway configuration that would let anyone on the network in.

    Without a token the gateway serves every request, so that is allowed only with
    ``insecure=True`` and on a loopback address, where only this machine can connect.

    Raises:
        UsageError: no token (and not insecure on a loopback address), or a token that is
            empty or has whitespace in it (a bearer token cannot carry it).
    """
    if token is not None:
        if not token or any(character.isspace() for character in token):
            raise UsageError(
                f"the gateway token must be a non-empty string without whitespace; set {TOKEN_ENV} to a random "
                f"secret, e.g. $(openssl rand -hex 32)",
                api="rayfleet gateway",
            )
        return
    if not insecure:
        raise UsageError(
            f"refusing to start the gateway without a token: set {TOKEN_ENV} to a random secret "
            f"(e.g. $(openssl rand -hex 32)) and send it as 'Authorization: Bearer <token>', or pass --insecure "
            f"to serve without one on 127.0.0.1",
            api="rayfleet gateway",
        )
    if not is_loopback(host):
        raise UsageError(
            f"--insecure serves without a token and is allowed only on a loopback address (127.0.0.1, ::1), "
            f"not on {host!r}; set {TOKEN_ENV} to serve on other addresses",
            api="rayfleet gateway",
        )
