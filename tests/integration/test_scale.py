"""1,000 agents across 2 hosts, each keeping its own State."""

import asyncio

import pytest

import rayfleet as rf

AGENTS = 1000
CHUNK = 200
# Bounds a chunk of concurrent calls so a stuck activation fails the test instead of
# hanging it. A healthy chunk finishes in a small fraction of this on a 2-CPU machine.
CHUNK_DEADLINE = 20.0


class Counter(rf.Agent):
    class State(rf.State):
        value: int = 0

    @rf.handler
    def add(self, n: int) -> int:
        self.state.value += n
        return self.state.value

    @rf.handler
    def get(self) -> int:
        return self.state.value


def number(ref: rf.AgentRef) -> int:
    return int(ref.identity.rsplit("/", 1)[1])


async def call_in_chunks(refs: list[rf.AgentRef], method: str, with_n: bool) -> list[object]:
    """``ref.ask`` every ref, CHUNK at a time; stops after the first chunk with a failure.

    Failures and timeouts come back as values (so the assertion can count them).
    """
    results: list[object] = []
    for start in range(0, len(refs), CHUNK):
        chunk = refs[start:start + CHUNK]
        calls = [
            ref.ask(method, n=number(ref), timeout=CHUNK_DEADLINE) if with_n
            else ref.ask(method, timeout=CHUNK_DEADLINE)
            for ref in chunk
        ]
        results.extend(await asyncio.gather(*calls, return_exceptions=True))
        if any(isinstance(result, BaseException) for result in results):
            break
    return results


def check_every_agent_kept_its_state(fleet: rf.Fleet, refs: list[rf.AgentRef]) -> None:
    added = asyncio.run(call_in_chunks(refs, "add", with_n=True))
    failed = {ref.identity: repr(result) for ref, result in zip(refs, added) if isinstance(result, BaseException)}
    assert not failed, f"{len(failed)} of {len(added)} add calls failed, e.g. {sorted(failed.items())[:3]}"
    assert added == [number(ref) for ref in refs]

    read = asyncio.run(call_in_chunks(refs, "get", with_n=False))
    assert len(read) == len(refs)
    wrong = {ref.identity: value for ref, value in zip(refs, read) if value != number(ref)}
    assert not wrong, f"{len(wrong)} agents read back the wrong value, e.g. {sorted(wrong.items())[:3]}"

    statuses = fleet.list()
    assert len(statuses) == AGENTS
    assert all(status.state is rf.LifecycleState.ACTIVE for status in statuses)
    # add then get: two committed turns each.
    assert all(status.checkpoint_version == 2 for status in statuses)
    per_host: dict[str, int] = {}
    for status in statuses:
        assert status.host is not None
        per_host[status.host] = per_host.get(status.host, 0) + 1
    assert set(per_host) == {host.name for host in fleet.hosts()}
    assert len(per_host) == 2 and all(count > 0 for count in per_host.values()), per_host


@pytest.mark.timeout(150)
@pytest.mark.xfail(
    strict=True,
    reason="BUG rayfleet/identity/_runtime.py HostRuntime._acquire/_flush_acquires: activations queued "
    "while a batched acquire is in flight are never flushed (no new flush task is started while the "
    "current one is not done), so concurrent first calls hang until some later activation arrives",
)
def test_thousand_agents_activated_concurrently_keep_their_own_state(fleet: rf.Fleet) -> None:
    refs = [fleet.spawn(f"scale/{i}", Counter) for i in range(AGENTS)]
    check_every_agent_kept_its_state(fleet, refs)


@pytest.mark.timeout(150)
def test_thousand_preactivated_agents_keep_their_own_state(fleet: rf.Fleet) -> None:
    # eager=True activates each agent at spawn, one at a time, which sidesteps the
    # concurrent-activation bug above; the concurrent turns then run on live agents.
    refs = [fleet.spawn(f"scale/{i}", Counter, eager=True) for i in range(AGENTS)]
    assert all(status.state is rf.LifecycleState.ACTIVE for status in fleet.list())
    check_every_agent_kept_its_state(fleet, refs)
