"""What code an HTTP client may make the fleet run: agent classes and workflows, by module.

The cluster and its storage are trusted; HTTP clients are not. A client names code only
by import path, and a path is used only when the operator allowed its module
(``RAYFLEET_ALLOWED_MODULES``) or, for agent classes, when the fleet already hosts that
class. So no request can make the gateway or a host import a module the operator did
not choose; the check runs before anything is imported.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..identity._agent import Agent, AgentSpec, resolve_object_path
from ..roster._roster import RosterFile
from ..workflow._definition import Workflow
from ._problems import HttpProblem

ALLOWED_MODULES_ENV = "RAYFLEET_ALLOWED_MODULES"


def allowed_modules_from_env(value: str | None) -> tuple[str, ...] | None:
    """Parse ``RAYFLEET_ALLOWED_MODULES``: comma-separated module names; unset or blank means none given (``None``)."""
    if value is None:
        return None
    names = tuple(name.strip() for name in value.split(",") if name.strip())
    return names or None


@dataclass(frozen=True, slots=True, kw_only=True)
class ModulePolicy:
    """Which modules HTTP clients may name code from.

    An entry allows that module and every module below it (``myapp`` allows
    ``myapp.agents``). ``None`` allows no module: then only agent classes the fleet
    already hosts can be named, and no workflow can be submitted.
    """

    allowed_modules: tuple[str, ...] | None = None

    def allows(self, module: str) -> bool:
        return any(module == allowed or module.startswith(allowed + ".") for allowed in self.allowed_modules or ())

    def describe(self) -> str:
        if not self.allowed_modules:
            return f"no module is allowed ({ALLOWED_MODULES_ENV} is not set)"
        return f"allowed modules: {', '.join(self.allowed_modules)} (from {ALLOWED_MODULES_ENV})"


def specs_from_roster(
    roster: RosterFile, *, known_classes: Mapping[str, type[Agent] | str], policy: ModulePolicy
) -> list[AgentSpec]:
    """The specs of a roster sent over HTTP, once every agent class in it is allowed.

    A class the fleet already hosts (a key of ``known_classes``, its path) is taken from
    the fleet's own spec, so the gateway never imports it by the client's word; any
    other path must name an allowed module. Every item is checked before any spec is
    built, so a refused roster imports nothing.

    Raises:
        HttpProblem: 403 naming the first item whose class is not allowed (``agents.N.agent``).
        InvalidSpecError: a spec the core refuses (identity syntax, a self peer, ...), as
            :meth:`RosterFile.to_specs` raises it.
    """
    agents = []
    for index, item in enumerate(roster.agents):
        path = item.agent
        if not isinstance(path, str):
            raise HttpProblem(400, "ValidationError", "agent must be an import path 'pkg.module:Class'",
                              field=f"agents.{index}.agent")
        if path in known_classes:
            agents.append(item.model_copy(update={"agent": known_classes[path]}))
            continue
        module = path.partition(":")[0]
        if not policy.allows(module):
            raise HttpProblem(
                403, "ModuleNotAllowed",
                f"agent class {path!r} (item {index}, identity {item.identity!r}) is neither a class this fleet "
                f"already hosts nor from a module the operator allows over HTTP; {policy.describe()}. "
                f"Nothing was applied. Spawn one agent of that class from a trusted driver, or ask the operator "
                f"to add its module to {ALLOWED_MODULES_ENV}",
                field=f"agents.{index}.agent",
            )
        agents.append(item)
    return RosterFile(agents=tuple(agents)).to_specs()


def known_agent_classes(specs: Iterable[AgentSpec]) -> dict[str, type[Agent] | str]:
    """Class path to the class (or path) the fleet's own specs run, one entry per path."""
    known: dict[str, type[Agent] | str] = {}
    for spec in specs:
        known.setdefault(spec.agent_class_path, spec.agent)
    return known


def workflow_from_path(path: str, params: Mapping[str, Any], *, policy: ModulePolicy) -> Workflow:
    """The workflow ``path`` names: an ``rf.Workflow``, or a function called with ``params`` that returns one.

    Raises:
        HttpProblem: 403 when the module is not allowed (checked before importing); 400 when
            it cannot be imported, names nothing, is not a workflow, or refuses ``params``.
    """
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise HttpProblem(400, "ValidationError", f"workflow {path!r} must look like 'pkg.module:attribute'",
                          field="workflow")
    if not policy.allows(module_name):
        raise HttpProblem(
            403, "ModuleNotAllowed",
            f"workflow {path!r} is not from a module the operator allows over HTTP; {policy.describe()}. "
            f"Ask the operator to add {module_name!r} (or its package) to {ALLOWED_MODULES_ENV}",
            field="workflow",
        )
    # A private name is as absent to a client as a missing one; a malformed one names nothing.
    no_such = HttpProblem(400, "ValidationError", f"module {module_name!r} has no public {attribute!r}",
                          field="workflow")
    if any(part.startswith("_") for part in attribute.split(".")):
        raise no_such
    try:
        target = resolve_object_path(path)
    except ImportError as error:
        raise HttpProblem(400, "ValidationError", f"cannot import module {module_name!r} for workflow {path!r}: "
                          f"{error}", field="workflow") from None
    except (AttributeError, ValueError):
        raise no_such from None
    if isinstance(target, Workflow):
        if params:
            raise HttpProblem(400, "ValidationError", f"{path!r} is a workflow, not a function: it takes no params",
                              field="params")
        return target
    if not callable(target) or inspect.isclass(target):
        raise HttpProblem(400, "ValidationError",
                          f"{path!r} is neither an rf.Workflow nor a function returning one", field="workflow")
    try:
        inspect.signature(target).bind(**params)
    except TypeError as error:
        raise HttpProblem(400, "ValidationError", f"params do not fit {path!r}: {error}", field="params") from None
    except ValueError:
        pass  # no signature to check against (a builtin); the call below decides
    try:
        built = target(**params)
    except Exception as error:  # noqa: BLE001 - the operator's function refused these params; say so, keep serving
        raise HttpProblem(400, "ValidationError", f"workflow function {path!r} raised {type(error).__name__}: "
                          f"{error}", field="params") from None
    if not isinstance(built, Workflow):
        raise HttpProblem(400, "ValidationError",
                          f"{path!r} returned {type(built).__name__}, not an rf.Workflow", field="workflow")
    return built
