"""The shape of the package: pinned namespaces, one home per public name, exported return types, no cycles."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import types
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest

import rayfleet
import rayfleet.demo
import rayfleet.ledger
import rayfleet.roster
import rayfleet.testing
import rayfleet.topology
import rayfleet.workflow

ROOT = Path(rayfleet.__file__).resolve().parent

PUBLIC_NAMESPACES = (
    "rayfleet", "rayfleet.testing", "rayfleet.topology", "rayfleet.roster", "rayfleet.workflow", "rayfleet.ledger",
    "rayfleet.demo",
)

# Every namespace that exports something, pinned: a move that drops or adds a name must say so here.
PINNED: dict[str, set[str]] = {
    "rayfleet.testing": {"InMemoryJournal", "LocalLedgerClient", "ManualClock", "ScriptedModel"},
    "rayfleet.topology": {"Edge", "LiveEdge", "ReconcilePlan", "ReconcileReport", "desired_edges", "export_topology",
                          "peers_of", "plan_reconcile"},
    "rayfleet.roster": {"RosterChange", "load_roster", "plan_roster", "validate_roster"},
    "rayfleet.workflow": {"Dispatcher", "Journal", "JournalState"},
    "rayfleet.cli": {"main"},
    "rayfleet.gateway": {"ALLOWED_MODULES_ENV", "GatewayLimits", "TOKEN_ENV", "allowed_modules_from_env", "build_app",
                         "openapi_document", "serve"},
    "rayfleet.demo": {"Bank", "Booking", "Counter", "Notebook", "Planner", "Refunds", "Researcher", "Reviewer"},
    "rayfleet.ledger": {"Activation", "ApprovalRequest", "ApprovalResolved", "ApprovalRow", "CheckpointCommit", "EdgeRow", "IdentityView", "JournalEntry", "JournalRecord",
                        "LeaseDenied", "LeaseGrant", "LeaseView", "LedgerCall", "LedgerClient", "LedgerLocation", "RegisterOutcome",
                        "RunRecord", "SnapshotPointer", "SpecRecord", "StoredMessage", "TopologyChange",
                        "TopologySnapshot", "TimerFired", "TimerRow", "TimerSpec", "TurnEnd", "TurnEntry", "TurnEntryKind", "TurnEntryState", "TurnEventRow", "TurnRecord",
                        "TurnWake", "TurnWrite"},
}
INTERNAL_PACKAGES = ("identity", "checkpoints", "host", "llm", "platform")


def _exports(namespace: str) -> set[str]:
    return set(importlib.import_module(namespace).__all__)


@pytest.mark.parametrize("namespace", sorted(PINNED))
def test_namespace_exports_are_pinned(namespace: str) -> None:
    module = importlib.import_module(namespace)
    assert set(module.__all__) >= PINNED[namespace]
    for name in module.__all__:
        assert getattr(module, name) is not None


@pytest.mark.parametrize("package", INTERNAL_PACKAGES)
def test_internal_packages_export_nothing(package: str) -> None:
    module = importlib.import_module(f"rayfleet.{package}")
    assert getattr(module, "__all__", []) == []
    assert module.__doc__, f"rayfleet.{package} needs a docstring saying what it holds"


def test_each_public_name_has_one_home() -> None:
    homes: dict[int, list[str]] = {}
    for namespace in PUBLIC_NAMESPACES:
        module = importlib.import_module(namespace)
        for name in module.__all__:
            homes.setdefault(id(getattr(module, name)), []).append(f"{namespace}.{name}")
    assert [places for places in homes.values() if len(places) > 1] == []


def _exported_objects() -> set[int]:
    return {id(getattr(importlib.import_module(ns), name)) for ns in PUBLIC_NAMESPACES for name in _exports(ns)}


def _classes_in(annotation: object) -> Iterator[type]:
    if isinstance(annotation, type) and not typing.get_args(annotation):
        yield annotation
    for argument in typing.get_args(annotation):
        yield from _classes_in(argument)
    origin = typing.get_origin(annotation)
    if isinstance(origin, type):
        yield origin


def _public_classes() -> list[type]:
    classes = []
    for namespace in PUBLIC_NAMESPACES:
        module = importlib.import_module(namespace)
        classes += [obj for name in module.__all__ if isinstance(obj := getattr(module, name), type)]
    return classes


def test_every_type_a_public_method_returns_is_exported() -> None:
    exported = _exported_objects()
    missing = set()
    for cls in _public_classes():
        for name, member in inspect.getmembers(cls, predicate=inspect.isfunction):
            if name.startswith("_") or member.__module__ != cls.__module__:
                continue
            hints = typing.get_type_hints(member)
            for returned in _classes_in(hints.get("return")):
                if returned.__module__.startswith("rayfleet") and id(returned) not in exported:
                    missing.add(f"{cls.__name__}.{name} -> {returned.__module__}.{returned.__qualname__}")
    assert sorted(missing) == []


def test_fleet_methods_do_not_shadow_builtins() -> None:
    fleet_methods = {name for name, _ in inspect.getmembers(rayfleet.Fleet, inspect.isfunction)}
    runs_methods = {name for name, _ in inspect.getmembers(rayfleet.RunsClient, inspect.isfunction)}
    builtin_names = set(dir(__builtins__) if isinstance(__builtins__, types.ModuleType) else __builtins__)
    assert fleet_methods & builtin_names == set()
    assert runs_methods & builtin_names == set()


def _module_imports(path: Path, module: str) -> set[str]:
    """The rayfleet modules ``module`` imports, TYPE_CHECKING blocks included."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("rayfleet"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("rayfleet"):
                continue
            found.add(target)
            # ``from . import _leases`` imports a module, not a name.
            for alias in node.names:
                if (ROOT.parent / (target.replace(".", "/") + f"/{alias.name}.py")).exists():
                    found.add(f"{target}.{alias.name}")
    return found


def _import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        graph[module] = _module_imports(path, module)
    # An import of a package also runs its __init__; resolve names to modules that exist.
    return {module: {t for t in targets if t in graph and t != module} for module, targets in graph.items()}


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return [*stack[stack.index(target):], target]
            if target not in state and (cycle := visit(target)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_cycles_inside_rayfleet() -> None:
    graph = _import_graph()
    # A package imports its own modules through its __init__; those edges are not cycles of concepts.
    for module in graph:
        graph[module] = {t for t in graph[module] if not (module.startswith(t + ".") and t != "rayfleet")}
    assert _find_cycle(graph) is None, " -> ".join(_find_cycle(graph) or [])


def test_cycle_finder_finds_a_cycle() -> None:
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None


def test_every_module_is_importable() -> None:
    for info in pkgutil.walk_packages([str(ROOT)], prefix="rayfleet."):
        if info.name.startswith("rayfleet.jobs."):
            continue  # entry points run the demo when executed, and import cleanly otherwise
        importlib.import_module(info.name)
