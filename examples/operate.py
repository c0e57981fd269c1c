"""Operating a fleet from Python: hosts and status, pause and resume, dead letters and their replay, a drain.

Run: python examples/operate.py
(on a local Ray it starts, or the cluster at RAY_ADDRESS; the fleet's storage is
RAYFLEET_STORAGE, else ./.rayfleet). The `rayfleet` command does the same from a shell
(`rayfleet hosts`, `status`, `pause`, `parked`, `resume`, `dead-letters`, `drain`).
Exits 0 when every check held.
"""

from __future__ import annotations

import contextlib
import time

from _checks import conclude

import rayfleet as rf

ORDERS = "shop/orders"


class Orders(rf.Agent):
    """Takes orders up to a size limit; a larger order is refused by raising (and so dead-lettered)."""

    class State(rf.State):
        orders: list[str] = []
        max_quantity: int = 10

    @rf.handler
    async def place(self, item: str, quantity: int) -> int:
        if quantity > self.state.max_quantity:
            raise ValueError(f"{quantity} x {item} is over the limit of {self.state.max_quantity}")
        self.state.orders = [*self.state.orders, f"{quantity} x {item}"]
        return len(self.state.orders)

    @rf.handler
    async def set_limit(self, max_quantity: int) -> None:
        self.state.max_quantity = max_quantity

    @rf.handler
    async def count(self) -> int:
        return len(self.state.orders)


def wait_for_parked(fleet: rf.Fleet, identity: str, expected: int, *, timeout: float = 30.0) -> list[rf.ParkedMessage]:
    """The parked messages of ``identity`` once there are ``expected`` (``tell`` returns before they arrive)."""
    deadline = time.monotonic() + timeout
    while len(parked := fleet.parked(identity)) < expected and time.monotonic() < deadline:
        time.sleep(0.05)
    return parked


def main() -> None:
    with rf.connect(hosts=2) as fleet:
        # What an earlier run of this script left in the storage would skew the counts.
        with contextlib.suppress(rf.UnknownIdentityError):
            fleet.delete(ORDERS)
        fleet.purge_dead_letters(ORDERS)
        orders = fleet.spawn(ORDERS, Orders, labels={"team": "shop"})
        orders.call("place", item="tea", quantity=2)

        # Hosts and status.
        for host in fleet.hosts():
            print(f"host {host.name}: node {host.node}, process {host.pid}, draining {host.draining}")
        status = fleet.status(ORDERS)
        print(f"{ORDERS} is {status.state.value} on {status.host}, fencing token "
              f"{status.lease.fencing_token if status.lease else '-'}, checkpoint version {status.checkpoint_version}")
        print(f"agents labelled team=shop: {[agent.identity for agent in fleet.list_agents(labels={'team': 'shop'})]}")
        turns = sum(statistics.turns for statistics in fleet.host_statistics())
        print(f"turns run on all hosts so far: {turns}")

        # Pause: later messages are parked durably, in order, until resume replays them.
        fleet.pause(ORDERS)
        for item in ("coffee", "cocoa", "mate"):
            orders.tell("place", item=item, quantity=1)
        parked = wait_for_parked(fleet, ORDERS, 3)
        print(f"paused {ORDERS}; parked: {[message.envelope.kwargs['item'] for message in parked]}")
        replayed = fleet.resume(ORDERS)
        after_resume = orders.call("count")
        print(f"resumed: {replayed} parked messages replayed in order; {ORDERS} now holds {after_resume} orders")

        # Dead letters: a refused message is kept with its reason, and can be replayed once the cause is fixed.
        try:
            orders.call("place", item="flour", quantity=50)
            refused = False
        except rf.HandlerError as error:
            refused = True
            print(f"an order of 50 was refused: {error.message}")
        letters = fleet.dead_letters(ORDERS)
        for letter in letters:
            print(f"dead letter {letter.id}: {letter.envelope.method}({letter.envelope.kwargs}) "
                  f"{letter.reason.value} after {letter.attempts} attempt(s): {letter.error.splitlines()[0]}")
        orders.call("set_limit", max_quantity=100)
        replies = [fleet.replay_dead_letter(letter.id) for letter in letters]
        print(f"raised the limit to 100 and replayed the letters: replies {replies}; "
              f"dead letters left: {len(fleet.dead_letters(ORDERS))}")

        # Drain: the agent's host checkpoints and releases it; the next message finds another host.
        drained_host = fleet.status(ORDERS).host
        assert drained_host is not None
        report = fleet.drain(drained_host)
        final_count = orders.call("count")
        moved_to = fleet.status(ORDERS).host
        fleet.undrain(drained_host)
        print(f"drained {drained_host} ({report.checkpointed} agent(s) checkpointed and released); "
              f"{ORDERS} answered {final_count} from {moved_to}")
        letters_left = fleet.dead_letters(ORDERS)

    checks = {
        "three told messages were parked while paused": len(parked) == 3,
        "resume replayed all three": replayed == 3 and after_resume == 4,
        "the oversized order was refused and dead-lettered as REJECTED":
            refused and [letter.reason for letter in letters] == [rf.DeadLetterReason.REJECTED],
        "its replay succeeded after the fix and removed the letter": replies == [5] and not letters_left,
        "the drain moved the agent to another host with its State": moved_to != drained_host and final_count == 5,
    }
    conclude("operate", checks)


if __name__ == "__main__":
    main()
