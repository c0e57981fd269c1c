"""Lease probes of requests waiting on their hosts: read together, never staler than the ask."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from rayfleet.errors import LedgerUnavailableError
from rayfleet.ledger._local import LocalLedgerClient
from rayfleet.ledger._values import LeaseView, SpecRecord
from rayfleet.platform._lease_probes import LeaseProbes


class Reads:
    """A real ledger client whose lease reads are counted and can be held open after they read."""

    def __init__(self, client: LocalLedgerClient) -> None:
        self.client = client
        self.asked: list[list[str]] = []
        self.hold: asyncio.Event | None = None
        self.fail: Exception | None = None

    async def leases(self, identities: list[str]) -> dict[str, LeaseView | None]:
        self.asked.append(list(identities))
        if self.fail is not None:
            raise self.fail
        leases = await self.client.leases(identities)
        if self.hold is not None:
            await self.hold.wait()
        return leases


@pytest.fixture
def client(tmp_path: Path) -> LocalLedgerClient:
    client = LocalLedgerClient(tmp_path / "ledger.sqlite")
    client.register_many([SpecRecord(identity=f"p/{index}", spec=b"s", fingerprint="f", agent_class="m:C")
                          for index in range(300)]).result()
    client.acquire(holder="h1@a", identities=[f"p/{index}" for index in range(100)], ttl=30.0).result()
    return client


def test_a_wave_of_probes_is_one_read_and_each_gets_its_own_lease(client: LocalLedgerClient) -> None:
    async def main() -> None:
        reads = Reads(client)
        probes = LeaseProbes(reads)  # type: ignore[arg-type]
        asked = [f"p/{index}" for index in range(300)] + ["p/7", "nobody"]
        leases = await asyncio.gather(*(probes.lease(identity) for identity in asked))
        assert len(reads.asked) == 1 and len(reads.asked[0]) == 301  # before: one read per request
        by_identity = dict(zip(asked, leases, strict=True))
        assert all(by_identity[f"p/{index}"].holder == "h1@a" for index in range(100))  # type: ignore[union-attr]
        assert all(by_identity[f"p/{index}"] is None for index in range(100, 300))
        assert by_identity["nobody"] is None

    asyncio.run(main())


def test_a_probe_asked_while_a_read_is_under_way_gets_a_read_begun_after_it(client: LocalLedgerClient) -> None:
    # Joining the read under way would answer with a lease seen before the ask: a lapse
    # (or, here, a grant) that happened in between would be missed.
    async def main() -> None:
        reads = Reads(client)
        reads.hold = asyncio.Event()
        probes = LeaseProbes(reads)  # type: ignore[arg-type]
        first = asyncio.ensure_future(probes.lease("p/200"))
        while not reads.asked:
            await asyncio.sleep(0)
        await client.acquire(holder="h2@b", identities=["p/200"], ttl=30.0)
        second = asyncio.ensure_future(probes.lease("p/200"))
        await asyncio.sleep(0.01)
        assert not second.done()
        reads.hold.set()
        assert await first is None
        seen = await second
        assert seen is not None and seen.holder == "h2@b"
        assert reads.asked == [["p/200"], ["p/200"]]

    asyncio.run(main())


def test_a_failed_read_fails_each_probe_and_a_cancelled_probe_leaves_the_others(client: LocalLedgerClient) -> None:
    async def main() -> None:
        reads = Reads(client)
        probes = LeaseProbes(reads)  # type: ignore[arg-type]
        reads.fail = LedgerUnavailableError(location="test.sqlite", detail="down for the test")
        outcomes: list[Any] = await asyncio.gather(probes.lease("p/1"), probes.lease("p/2"), return_exceptions=True)
        assert [type(outcome) for outcome in outcomes] == [LedgerUnavailableError] * 2

        reads.fail = None
        reads.hold = asyncio.Event()
        gone = asyncio.ensure_future(probes.lease("p/1"))
        kept = asyncio.ensure_future(probes.lease("p/1"))
        while len(reads.asked) < 2:
            await asyncio.sleep(0)
        gone.cancel()
        reads.hold.set()
        seen = await kept
        assert seen is not None and seen.holder == "h1@a"
        assert gone.cancelled()

    asyncio.run(main())
