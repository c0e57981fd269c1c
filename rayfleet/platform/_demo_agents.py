"""Agents used by ``rayfleet demo`` (importable so hosts load them by reference)."""

from __future__ import annotations

import rayfleet.identity as rfi


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
