"""What Linux says of a process, for tests that stop, continue and end real ones."""

from __future__ import annotations


def process_state(pid: int) -> str | None:
    """The one-letter scheduler state of process ``pid`` (``R``, ``S``, ``T``, ``Z``, ...), or ``None`` if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as stat:
            # "pid (command name) state ...": the name may hold spaces and parentheses.
            return stat.read().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return None


def ended(pid: int) -> bool:
    """Whether process ``pid`` has ended (gone, or a zombie its parent has not reaped yet)."""
    return process_state(pid) in (None, "Z")
