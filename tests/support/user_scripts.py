"""Run what a user runs (an example script, the code of a docs page) inside the test session.

A user runs ``python examples/x.py`` from a checkout, with ``rf.connect()`` choosing the
fleet from the environment. The tests run the same code in-process, against the session's
one local Ray, with the environment pointing ``rf.connect()`` at a fresh storage folder and
a Ray namespace of its own, so nothing is shared with other tests; the fleet's actors are
stopped afterwards (a driver that attached to a running Ray leaves them running, as it
should for a user, so the test stops them).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import ray

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True, slots=True)
class UserSetting:
    """Where a user's script runs: its working folder, its fleet's storage and Ray namespace."""

    workdir: Path
    storage: Path
    namespace: str


@contextlib.contextmanager
def as_a_user(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[UserSetting]:
    """Point ``rf.connect()`` at a fresh fleet and work in ``workdir``; stop that fleet's actors after.

    ``workdir`` holds a link to the checkout's ``examples/``, so code that names
    ``examples/team.yaml`` finds it as it would when run from the repository root,
    while whatever the code writes lands in ``workdir``.
    """
    setting = UserSetting(workdir=workdir, storage=workdir / ".rayfleet", namespace=f"u-{uuid.uuid4().hex[:10]}")
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "examples").symlink_to(REPO / "examples", target_is_directory=True)
    monkeypatch.chdir(workdir)
    monkeypatch.setenv("RAYFLEET_STORAGE", str(setting.storage))
    monkeypatch.setenv("RAYFLEET_NAMESPACE", setting.namespace)
    for variable in ("RAYFLEET_LEDGER", "RAY_ADDRESS"):
        monkeypatch.delenv(variable, raising=False)
    try:
        yield setting
    finally:
        stop_actors(setting.namespace)


def actors_in(namespace: str) -> list[str]:
    """Names of the named actors that live in Ray namespace ``namespace``."""
    return sorted(actor["name"] for actor in ray.util.list_named_actors(all_namespaces=True)
                  if actor["namespace"] == namespace)


def stop_actors(namespace: str) -> None:
    """Kill every named actor of ``namespace`` (hosts, the ledger actor, the workflow runner)."""
    for name in actors_in(namespace):
        with contextlib.suppress(ValueError):  # gone already
            ray.kill(ray.get_actor(name, namespace=namespace), no_restart=True)

