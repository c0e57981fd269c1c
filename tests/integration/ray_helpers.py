"""Helpers shared by the integration tests."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import ray


def kill_actor(name: str, namespace: str) -> None:
    """``ray.kill`` a named actor for good and wait until Ray no longer knows it and its process is gone.

    ``ray.kill`` returns before the actor is gone; a call sent right after it may still
    be served by the dying actor, which would make "served by another host" flaky. Ray
    forgets the name before the process exits, and a caller holding the actor's handle
    could still reach it then (CI: the dying host served and committed the next call
    of a test, whose reply was lost, and the call without an idempotency key ran again
    on the survivor), so this also waits for the process (actors run on this machine).
    """
    handle = ray.get_actor(name, namespace=namespace)
    pid = ray.get(handle.__ray_call__.remote(lambda actor: os.getpid()), timeout=30)
    ray.kill(handle, no_restart=True)
    for _ in range(400):
        try:
            ray.get_actor(name, namespace=namespace)
        except ValueError:
            if not _running(pid):
                return
        time.sleep(0.025)
    raise AssertionError(f"actor {name} (process {pid}) did not die within 10 s")


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and has not exited (a zombie waiting to be reaped has)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def kill_processes_under(temp_dir: Path) -> None:
    """Stop every process whose command line names ``temp_dir``: the Ray processes a test started there.

    ``ray stop`` would stop every Ray on the machine, other people's included.
    """
    mine = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(temp_dir) in command:
            mine.append(int(entry.name))
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in mine:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        time.sleep(1.0)


def host_reply(answer: tuple[str, object]) -> tuple[str, object]:
    """A host actor's ``deliver`` answer as ``(kind, value)``: an ``"ok"`` answer carries the
    turn's wire form (value, usage, journaled step), of which tests reaching a host directly
    want the handler's value; an error answer is the error itself."""
    kind, payload = answer
    if kind == "ok":
        assert isinstance(payload, tuple), payload
        return kind, payload[0]
    return kind, payload
