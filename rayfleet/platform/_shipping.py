"""Agent-class shipping: how a spec is pickled so that any host can rebuild it, whoever started the host."""

from __future__ import annotations

import dataclasses
import functools
import pickle
import sys
from pathlib import Path
from typing import Any

import cloudpickle

from ..errors import InvalidSpecError
from ..identity._agent import Agent, AgentSpec
from ..ledger._values import SpecRecord


def spec_record(spec: AgentSpec) -> SpecRecord:
    """The ledger's record of a spec (the spec itself travels pickled)."""
    return SpecRecord(
        identity=spec.identity, spec=pickle_spec(spec), fingerprint=spec.fingerprint(),
        agent_class=spec.agent_class_path, labels=dict(spec.labels), addressability=spec.addressability.value,
        peers=tuple(spec.peers),
    )


def pickle_spec(spec: AgentSpec) -> bytes:
    """Pickle a spec so any host can rebuild it, whoever started the host and wherever.

    Agent classes from the user's own files (not an installed package) are pickled by
    value, whether the spec names the class itself or a ``"module:Class"`` path (a
    roster's module beside the roster file, a script's folder added to ``sys.path``):
    hosts are detached actors started by whichever driver came first, with that
    driver's ``sys.path`` and working directory, so they cannot import a module only
    this driver sees. The bytes go into the ledger with the spec, so a host Ray
    restarts later rebuilds the class from there too. Classes of installed packages
    are pickled by reference, as Ray users would expect: install them on every node.

    The class is pickled once per process and its bytes reused for every spec that
    names it, so creating many agents of one class costs little per agent.

    Raises:
        InvalidSpecError: the agent class must travel by value and cannot be pickled.
    """
    agent = spec.agent
    if isinstance(agent, str):
        resolved = spec.agent_class  # the driver imported it when the spec was built
        if not _ships_by_value(resolved):
            pickled: bytes = cloudpickle.dumps(spec)
            return pickled
        agent = resolved
    fields = {field.name: getattr(spec, field.name) for field in dataclasses.fields(spec) if field.name != "agent"}
    package = _SpecPackage(fields, _class_bytes(agent))
    try:
        return pickle.dumps(package, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError):
        pickled = cloudpickle.dumps(package)  # e.g. a lambda in the spec's context
        return pickled


_CLASS_BYTES: dict[type[Agent], bytes] = {}


def _class_bytes(agent: type[Agent]) -> bytes:
    cached = _CLASS_BYTES.get(agent)
    if cached is None:
        if _ships_by_value(agent):
            for module in _modules_shipped_with(agent):
                cloudpickle.register_pickle_by_value(module)
        try:
            cached = cloudpickle.dumps(agent)
        except Exception as error:  # cloudpickle raises many types for unpicklable module state
            raise InvalidSpecError(
                f"agent class {agent.__module__}:{agent.__qualname__} is not installed on the cluster, so it "
                f"travels to the hosts by value, but it cannot be pickled ({type(error).__name__}: {error}). "
                f"Keep unpicklable objects (locks, connections, clients) out of its module's globals and create "
                f"them in on_activate, or install its package on every node",
                field="agent",
            ) from error
        _CLASS_BYTES[agent] = cached
    return cached


def _ships_by_value(agent: type[Agent]) -> bool:
    """Whether hosts may lack ``agent``'s module: it comes from a file that no installed package holds."""
    location = getattr(sys.modules.get(agent.__module__), "__file__", None)
    return bool(location) and not _is_installed(str(location))


def _modules_shipped_with(agent: type[Agent]) -> list[Any]:
    """``agent``'s module and every loaded module importable from the same ``sys.path`` folder.

    A module beside a roster, or in a folder only this driver has on its path, often
    imports helpers from next to it; those travel by value as well, or the host would
    fail to import them while rebuilding the class. Modules imported later, from
    inside a handler, are not known here and must be installed on the nodes.
    """
    module = sys.modules[agent.__module__]
    root = _import_root(module)
    shipped = [module]
    if root is None:
        return shipped
    for name, other in list(sys.modules.items()):
        location = getattr(other, "__file__", None)
        if other is module or not location or name == "__main__" or _is_installed(str(location)):
            continue
        if _import_root(other) == root:
            shipped.append(other)
    return shipped


def _import_root(module: Any) -> Path | None:
    """The folder on ``sys.path`` a module was imported from (``a.b`` in ``/x/a/b.py`` -> ``/x``)."""
    location = getattr(module, "__file__", None)
    name = getattr(module, "__name__", "")
    if name == "__main__":
        # `python -m pkg.tool` runs pkg/tool.py as __main__ from the folder above pkg/.
        spec = getattr(module, "__spec__", None)
        name = spec.name if spec is not None and spec.name else ""
    if not location:
        return None
    path = Path(location).resolve()
    depth = name.count(".") + (1 if path.name == "__init__.py" else 0)
    if depth >= len(path.parents):
        return None
    return path.parents[depth]


class _SpecPackage:
    """A spec in transit: its fields, and its agent class as bytes pickled once per class."""

    __slots__ = ("class_bytes", "fields")

    def __init__(self, fields: dict[str, Any], class_bytes: bytes) -> None:
        self.fields = fields
        self.class_bytes = class_bytes

    def __reduce__(self) -> tuple[Any, tuple[dict[str, Any], bytes]]:
        return (rebuild_spec, (self.fields, self.class_bytes))


def rebuild_spec(fields: dict[str, Any], class_bytes: bytes) -> AgentSpec:
    return AgentSpec(agent=_agent_class(class_bytes), **fields)


@functools.lru_cache(maxsize=256)
def _agent_class(class_bytes: bytes) -> Any:
    """The agent class pickled as ``class_bytes`` (a path, or a class by value), rebuilt once per process.

    cloudpickle keeps one class object per pickled class in a process, so every spec of
    one agent class gets the same class (State codecs and group commits are keyed by
    it); but it builds the class anew before finding that out, running the metaclass
    (a State's pydantic schema) on every activation. Equal bytes are the same class.
    """
    return cloudpickle.loads(class_bytes)


def _is_installed(path: str) -> bool:
    parts = Path(path).resolve().parts
    return "site-packages" in parts or "dist-packages" in parts or Path(path).resolve().is_relative_to(_PACKAGE_ROOT)


_PACKAGE_ROOT = Path(__file__).resolve().parent.parent
