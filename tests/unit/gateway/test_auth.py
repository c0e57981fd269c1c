"""The bearer-token check and the rule for starting without a token."""

from __future__ import annotations

import hmac

import pytest

import rayfleet as rf
from rayfleet.gateway._auth import bearer_token_matches, check_startup, is_loopback

TOKEN = "s3cret-token-0123456789"


@pytest.mark.parametrize(("header", "expected"), [
    (f"Bearer {TOKEN}", True),
    (f"bearer {TOKEN}", True),
    (f"  Bearer   {TOKEN}  ", True),
    (None, False),
    ("", False),
    ("Bearer", False),
    ("Bearer ", False),
    (f"Basic {TOKEN}", False),
    (TOKEN, False),
    (f"Bearer {TOKEN}x", False),
    (f"Bearer {TOKEN[:-1]}", False),
    ("Bearer s3cret-tökén", False),
])
def test_bearer_token_matches_only_the_exact_token(header: str | None, expected: bool) -> None:
    assert bearer_token_matches(header, TOKEN) is expected


def test_bearer_token_compares_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    assert not bearer_token_matches("Bearer wrong", TOKEN)
    assert compared == [(b"wrong", TOKEN.encode())]


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.1.2.3", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("0.0.0.0", False), ("::", False), ("10.0.0.5", False), ("example.com", False), ("", False),
])
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_a_token_is_enough_on_any_address() -> None:
    check_startup(host="0.0.0.0", token=TOKEN, insecure=False)
    check_startup(host="127.0.0.1", token=TOKEN, insecure=True)


def test_no_token_is_refused_without_insecure() -> None:
    with pytest.raises(rf.UsageError, match="RAYFLEET_GATEWAY_TOKEN") as caught:
        check_startup(host="127.0.0.1", token=None, insecure=False)
    assert "--insecure" in str(caught.value)


def test_insecure_is_allowed_on_loopback_only() -> None:
    check_startup(host="127.0.0.1", token=None, insecure=True)
    check_startup(host="::1", token=None, insecure=True)
    with pytest.raises(rf.UsageError, match="loopback") as caught:
        check_startup(host="0.0.0.0", token=None, insecure=True)
    assert "'0.0.0.0'" in str(caught.value)


@pytest.mark.parametrize("token", ["", "two words", "tab\there"])
def test_a_malformed_token_is_refused(token: str) -> None:
    with pytest.raises(rf.UsageError, match="without whitespace"):
        check_startup(host="127.0.0.1", token=token, insecure=False)
