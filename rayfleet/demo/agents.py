"""Small agents for the demo and the example rosters (importable, so hosts load them by path)."""

from __future__ import annotations

import asyncio

import rayfleet as rf
from rayfleet.errors import NotWiredError


class Counter(rf.Agent):
    """Adds numbers; its total survives host crashes."""

    class State(rf.State):
        total: int = 0

    @rf.handler
    async def add(self, n: int) -> int:
        self.state.total += n
        total: int = self.state.total
        return total

    @rf.handler
    async def get(self) -> int:
        total: int = self.state.total
        return total


class Notebook(rf.Agent):
    """Keeps a list of notes with who wrote them."""

    class Note(rf.State):
        author: str
        text: str

    class State(rf.State):
        notes: list[Notebook.Note] = []

    @rf.handler
    async def write(self, author: str, text: str) -> int:
        self.state.notes = [*self.state.notes, Notebook.Note(author=author, text=text)]
        return len(self.state.notes)

    @rf.handler
    async def read(self) -> list[str]:
        return [f"{note.author}: {note.text}" for note in self.state.notes]


class Researcher(rf.Agent):
    """Answers questions on one topic and counts how many it answered."""

    class State(rf.State):
        answered: int = 0

    @rf.handler
    async def research(self, question: str) -> str:
        self.state.answered += 1
        topic = self.spec.labels.get("topic", "everything")
        return f"{self.identity} ({topic}) on {question!r}: finding #{self.state.answered}"


class Planner(rf.Agent):
    """Splits a question among its wired peers and collects their findings."""

    class State(rf.State):
        plans: list[str] = []

    @rf.handler
    async def plan(self, question: str) -> dict[str, str]:
        findings = {peer: await self.send(peer, "research", question=question) for peer in self.peers}
        self.state.plans = [*self.state.plans, question]
        return findings

    @rf.handler
    async def ask_peer(self, peer: str, question: str) -> str:
        """Reach one identity; under enforced topology an unwired one is refused with NotWiredError."""
        try:
            return str(await self.send(peer, "research", question=question))
        except NotWiredError as error:
            return f"refused: {error.message}"


class Booking(rf.Agent):
    """An airline or hotel desk: reserve and cancel, counting each effect once per call."""

    class State(rf.State):
        reservations: dict[str, int] = {}
        cancelled: list[str] = []
        calls: int = 0

    @rf.handler
    async def reserve(self, trip: str, nights: int = 1) -> dict[str, object]:
        self.state.calls += 1
        self.state.reservations = {**self.state.reservations, trip: nights}
        return {"trip": trip, "by": self.identity, "nights": nights, "ok": True}

    @rf.handler
    async def cancel(self, trip: str, **_: object) -> str:
        self.state.reservations = {k: v for k, v in self.state.reservations.items() if k != trip}
        self.state.cancelled = [*self.state.cancelled, trip]
        return f"cancelled {trip}"

    @rf.handler
    async def report(self) -> dict[str, object]:
        report: dict[str, object] = self.state.model_dump()
        return report


class Reviewer(rf.Agent):
    """Scores a reservation; reports token usage like an LLM call would."""

    class State(rf.State):
        reviews: int = 0

    @rf.handler
    async def review(self, trip: str, **_: object) -> rf.Reply:
        self.state.reviews += 1
        score = 3 + len(self.identity) % 3
        return rf.Reply({"score": score, "reviewer": self.identity}, usage=rf.Usage(prompt_tokens=40,
                                                                                      completion_tokens=10))


class Bank(rf.Agent):
    """Charges a card; declines amounts over its limit."""

    class State(rf.State):
        charged: list[str] = []
        limit: int = 1000

    @rf.handler
    async def charge(self, trip: str, amount: int = 100, delay: float = 0.0, **_: object) -> dict[str, object]:
        if delay:
            await asyncio.sleep(delay)  # a slow payment provider
        if amount > self.state.limit:
            raise ValueError(f"card declined: {amount} is over the limit of {self.state.limit}")
        self.state.charged = [*self.state.charged, trip]
        return {"ok": True, "trip": trip, "amount": amount}


class Refunds(rf.Agent):
    """Refunds an order once a manager approves it: the turn waits durably, holding no host."""

    class State(rf.State):
        refunded: dict[str, int] = {}

    @rf.handler
    async def refund(self, order: str, eur: int) -> str:
        decision = await self.approval("refund", data={"order": order, "eur": eur}, approvers=["manager"])
        if not decision.approved:
            return f"refund of {order} refused by {decision.by}"
        self.state.refunded[order] = eur
        return f"refunded {eur} EUR for {order}, approved by {decision.by}"


def support_desk(model_url: str) -> type[rf.ChatAgent]:
    """A model agent on the chat completions server at ``model_url`` (the demo's scripted one).

    Made per server, as the URL is known only once the server runs; the class travels to
    the hosts by value.
    """

    class SupportDesk(rf.ChatAgent):
        """Answers order questions, looking orders up with its tool."""

        model = rf.Model("scripted", base_url=model_url)
        instructions = "You answer questions about orders. Be brief."

        @rf.tool
        async def order_status(self, order_id: int) -> str:
            """Look up where an order is.

            Args:
                order_id: the order's number.
            """
            return f"order {order_id}: shipped this morning, arriving Thursday"

    return SupportDesk
