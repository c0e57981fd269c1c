"""A saga: book a trip (flight, hotel, insurance quotes from every insurer, payment), undone when payment fails.

Run: python examples/saga.py
(on a local Ray it starts, or the cluster at RAY_ADDRESS; the fleet's storage is
RAYFLEET_STORAGE, else ./.rayfleet). It runs the trip workflow twice: a cheap trip
completes; an expensive one is declined at payment, and the steps already done are
compensated in reverse order (hotel, then flight). Exits 0 when every check held.
"""

from __future__ import annotations

from _checks import conclude

import rayfleet as rf

NIGHTS = 2
INSURERS = {"insurer/acme": 7, "insurer/bolt": 5, "insurer/calm": 9}
"""Each insurer's price per day; a scatter step asks all of them."""


class Desk(rf.Agent):
    """An airline or hotel desk: reservations by trip."""

    class State(rf.State):
        held: dict[str, int] = {}

    @rf.handler
    async def reserve(self, trip: str, nights: int = 1) -> dict[str, object]:
        self.state.held = {**self.state.held, trip: nights}
        return {"trip": trip, "desk": self.identity, "nights": nights}

    @rf.handler
    async def cancel(self, trip: str) -> str:
        # A compensation may find nothing to undo (a step can fail after its effect); that is fine.
        self.state.held = {held: nights for held, nights in self.state.held.items() if held != trip}
        return f"{self.identity} cancelled {trip}"

    @rf.handler
    async def holds(self, trip: str) -> bool:
        return trip in self.state.held


class Insurer(rf.Agent):
    """Quotes travel insurance at its own daily price (a label of its spec)."""

    @rf.handler
    async def quote(self, trip: str, days: int) -> int:
        return days * int(self.spec.labels["daily"])


class Bank(rf.Agent):
    """Charges a card; declines amounts over its limit (the handler raises, so the step fails)."""

    class State(rf.State):
        limit: int = 500
        charged: dict[str, int] = {}

    @rf.handler
    async def charge(self, trip: str, amount: int) -> dict[str, object]:
        if amount > self.state.limit:
            raise ValueError(f"card declined: {amount} is over the limit of {self.state.limit}")
        self.state.charged = {**self.state.charged, trip: amount}
        return {"trip": trip, "amount": amount, "ok": True}


def trip(name: str, *, price_per_night: int) -> rf.Workflow:
    """The trip workflow; its run id names the trip, so every run books its own."""
    workflow = rf.Workflow(name, budget=rf.Budget(invocations=20, wall_clock=120.0))
    workflow.step("flight", to="trip/airline", call="reserve", payload=lambda ctx: {"trip": ctx.run_id}) \
        .compensate("cancel", payload=lambda ctx: {"trip": ctx.run_id})
    workflow.step("hotel", to="trip/hotel", call="reserve", after="flight",
                  payload=lambda ctx: {"trip": ctx.run_id, "nights": NIGHTS}) \
        .compensate("cancel", payload=lambda ctx: {"trip": ctx.run_id})
    # Scatter/gather: every agent labelled role=insurer quotes; AllOf waits for all of them.
    workflow.step("quotes", scatter=rf.Select(labels={"role": "insurer"}), gather=rf.AllOf(), call="quote",
                  after="hotel", payload=lambda ctx: {"trip": ctx.run_id, "days": NIGHTS + 1})
    workflow.step("pay", to="trip/bank", call="charge", after="quotes",
                  payload=lambda ctx: {"trip": ctx.run_id,
                                       "amount": NIGHTS * price_per_night + min(ctx.outputs["quotes"].values())}) \
        .verify(lambda out: out["ok"])
    return workflow


def main() -> None:
    with rf.connect() as fleet:
        airline = fleet.spawn("trip/airline", Desk)
        hotel = fleet.spawn("trip/hotel", Desk)
        fleet.spawn("trip/bank", Bank)
        for identity, daily in INSURERS.items():
            fleet.spawn(identity, Insurer, labels={"role": "insurer", "daily": str(daily)})

        good = fleet.run(trip("cheap-trip", price_per_night=100))
        print(f"cheap trip {good.run_id}: {good.status.value} after {good.invocations} dispatches")
        print(f"  quotes gathered from every insurer: {good.outputs.get('quotes')}")
        print(f"  paid: {good.outputs.get('pay')}")

        bad = fleet.run(trip("expensive-trip", price_per_night=400))
        print(f"expensive trip {bad.run_id}: {bad.status.value}; the error: {bad.error}")
        print(f"  compensated, in this order: {', '.join(bad.compensated)}")

        kept = airline.call("holds", trip=good.run_id) and hotel.call("holds", trip=good.run_id)
        undone = not airline.call("holds", trip=bad.run_id) and not hotel.call("holds", trip=bad.run_id)
        print(f"the desks hold the cheap trip: {kept}; they hold nothing of the expensive one: {undone}")

    checks = {
        "the cheap trip completed": good.status is rf.RunStatus.COMPLETED,
        "every insurer quoted": set(good.outputs.get("quotes", {})) == set(INSURERS),
        "the cheap trip paid the cheapest quote": good.outputs.get("pay", {}).get("amount") == 2 * 100 + 3 * 5,
        "the expensive trip was compensated": bad.status is rf.RunStatus.COMPENSATED,
        "the failed step was the payment": isinstance(bad.error, rf.StepFailedError) and bad.error.step == "pay",
        "compensations ran in reverse order of completion": bad.compensated == ("hotel", "flight"),
        "the cheap trip's reservations stand and the expensive one's are undone": kept and undone,
    }
    conclude("saga", checks)


if __name__ == "__main__":
    main()
