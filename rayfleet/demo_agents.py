"""Small agents for the demo and the example rosters (importable, so hosts load them by path)."""

from __future__ import annotations

import rayfleet.identity as rfi
from rayfleet.errors import NotWiredError


class Counter(rfi.Agent):
    """Adds numbers; its total survives host crashes."""

    class State(rfi.State):
        total: int = 0

    @rfi.handler
    async def add(self, n: int) -> int:
        self.state.total += n
        return self.state.total

    @rfi.handler
    async def get(self) -> int:
        return self.state.total


class Notebook(rfi.Agent):
    """Keeps a list of notes with who wrote them."""

    class Note(rfi.State):
        author: str
        text: str

    class State(rfi.State):
        notes: list[Notebook.Note] = []

    @rfi.handler
    async def write(self, author: str, text: str) -> int:
        self.state.notes = [*self.state.notes, Notebook.Note(author=author, text=text)]
        return len(self.state.notes)

    @rfi.handler
    async def read(self) -> list[str]:
        return [f"{note.author}: {note.text}" for note in self.state.notes]


class Researcher(rfi.Agent):
    """Answers questions on one topic and counts how many it answered."""

    class State(rfi.State):
        answered: int = 0

    @rfi.handler
    async def research(self, question: str) -> str:
        self.state.answered += 1
        topic = self.spec.labels.get("topic", "everything")
        return f"{self.identity} ({topic}) on {question!r}: finding #{self.state.answered}"


class Planner(rfi.Agent):
    """Splits a question among its wired peers and collects their findings."""

    class State(rfi.State):
        plans: list[str] = []

    @rfi.handler
    async def plan(self, question: str) -> dict[str, str]:
        findings = {peer: await self.send(peer, "research", question=question) for peer in self.peers}
        self.state.plans = [*self.state.plans, question]
        return findings

    @rfi.handler
    async def ask_peer(self, peer: str, question: str) -> str:
        """Reach one identity; under enforced topology an unwired one is refused with NotWiredError."""
        try:
            return str(await self.send(peer, "research", question=question))
        except NotWiredError as error:
            return f"refused: {error.message}"
