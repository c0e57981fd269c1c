"""Rosters: YAML or in-code lists of agent specs, their validation and their diff against a fleet."""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import yaml

from ..errors import InvalidSpecError

# RetryPolicy comes through _spec so topology depends only on the identity modules listed as Ray-free.
from ..identity._spec import AgentSpec, RetryPolicy

# Keys a roster item may carry: exactly the AgentSpec fields, so YAML and code agree.
ALLOWED_KEYS: tuple[str, ...] = tuple(item.name for item in fields(AgentSpec))
_REQUIRED_KEYS = ("identity", "agent")
_TEXT_SOURCE = "<roster text>"

RosterSource = str | os.PathLike[str] | Sequence[AgentSpec | Mapping[str, Any]]


def load_roster(source: RosterSource) -> list[AgentSpec]:
    """Read a roster into validated specs, in roster order.

    ``source`` may be a path to a YAML file (a ``str`` is taken as a path if it names an
    existing file or ends in ``.yaml``/``.yml``), YAML text (a ``str`` containing a
    newline), or a list of :class:`AgentSpec` and/or mappings of spec fields. The YAML
    shape is a mapping with an ``agents`` list whose items are mappings of spec fields
    (``identity``, ``agent`` as ``"pkg.module:Class"``, ``labels``, ``peers``, ...).

    Only the roster itself is checked here (fields, duplicates); whether every peer
    exists depends on the fleet, so call :func:`validate_roster` for that.

    Raises:
        InvalidSpecError: naming the file (or ``<roster text>``), the line of the
            offending item and its identity, for: a missing file, invalid YAML, a top
            level that is not a mapping with an ``agents`` list, an item that is not a
            mapping, unknown or missing keys, a field the spec refuses (including an
            agent class that cannot be imported), or a repeated identity (INV-06; both
            lines are named).
    """
    if isinstance(source, os.PathLike) or (
        isinstance(source, str) and (source.endswith((".yaml", ".yml")) or _is_file(source))
    ):
        path = os.fspath(source)
        try:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
        except OSError as error:
            raise InvalidSpecError(
                f"cannot read roster file {path!r}: {error.strerror or error}. Check the path.", subject=path
            ) from None
        return _load_yaml(text, path)
    if isinstance(source, str):
        if "\n" in source:
            return _load_yaml(source, _TEXT_SOURCE)
        raise InvalidSpecError(
            f"roster file {source!r} does not exist. Pass an existing .yaml/.yml path, YAML text, "
            f"or a list of AgentSpec.",
            subject=source,
        )
    if isinstance(source, Sequence):
        items = [(item, f"item {index}") for index, item in enumerate(source)]
        return _build_specs(items, "roster list")
    raise InvalidSpecError(
        f"a roster must be a YAML path, YAML text, or a list of AgentSpec or mappings, got {type(source).__name__}",
        subject="roster",
    )


def _is_file(text: str) -> bool:
    try:
        return "\n" not in text and os.path.isfile(text)
    except (OSError, ValueError):
        return False


def _load_yaml(text: str, where: str) -> list[AgentSpec]:
    loader = yaml.SafeLoader(text)
    try:
        # One parse gives both the node tree (for line numbers) and the Python values.
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
        place = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error)
        raise InvalidSpecError(
            f"roster {where}{place}: invalid YAML ({problem}). Fix the syntax there.", subject=where
        ) from None
    finally:
        loader.dispose()
    if not isinstance(data, Mapping) or not isinstance(data.get("agents"), list):
        raise InvalidSpecError(
            f"roster {where}: the top level must be a mapping with an 'agents' list, e.g.\n"
            f"agents:\n  - identity: team/planner\n    agent: mypkg.agents:Planner",
            subject=where,
        )
    item_lines = _agent_item_lines(node)
    items = [
        (item, f"line {item_lines[index]}" if index < len(item_lines) else f"item {index}")
        for index, item in enumerate(data["agents"])
    ]
    return _build_specs(items, where)


def _agent_item_lines(node: yaml.Node) -> list[int]:
    """1-based start line of each item of the top-level ``agents`` sequence."""
    if not isinstance(node, yaml.MappingNode):
        return []
    for key, value in node.value:
        if isinstance(key, yaml.ScalarNode) and key.value == "agents" and isinstance(value, yaml.SequenceNode):
            return [item.start_mark.line + 1 for item in value.value]
    return []


def _build_specs(items: Sequence[tuple[object, str]], where: str) -> list[AgentSpec]:
    specs: list[AgentSpec] = []
    seen: dict[str, str] = {}
    for item, place in items:
        spec = item if isinstance(item, AgentSpec) else _spec_from_mapping(item, where, place)
        if spec.identity in seen:
            raise InvalidSpecError(
                f"roster {where}: duplicate identity {spec.identity!r} at {seen[spec.identity]} and {place} "
                f"(identities in a roster must be unique). Remove or rename one of them.",
                subject=spec.identity,
            )
        seen[spec.identity] = place
        specs.append(spec)
    return specs


def _spec_from_mapping(item: object, where: str, place: str) -> AgentSpec:
    if not isinstance(item, Mapping):
        raise InvalidSpecError(
            f"roster {where} {place}: each agent must be a mapping of spec fields "
            f"(identity, agent, ...), got {type(item).__name__} {item!r}",
            subject=where,
        )
    raw_identity = item.get("identity")
    who = f" (identity {raw_identity!r})" if raw_identity is not None else ""
    unknown = sorted(str(key) for key in item if key not in ALLOWED_KEYS)
    if unknown:
        raise InvalidSpecError(
            f"roster {where} {place}{who}: unknown key(s) {', '.join(unknown)}. "
            f"Allowed keys: {', '.join(ALLOWED_KEYS)}.",
            subject=str(raw_identity or where),
        )
    missing = [key for key in _REQUIRED_KEYS if key not in item]
    if missing:
        raise InvalidSpecError(
            f"roster {where} {place}{who}: missing required key(s) {', '.join(missing)}. "
            f"Every agent needs an identity and an agent class path 'pkg.module:Class'.",
            subject=str(raw_identity or where),
        )
    values = dict(item)
    try:
        if isinstance(values.get("retry"), Mapping):
            values["retry"] = RetryPolicy(**values["retry"])
        if isinstance(values.get("peers"), list):
            values["peers"] = tuple(values["peers"])
        return AgentSpec(**values)
    except InvalidSpecError as error:
        raise InvalidSpecError(f"roster {where} {place}{who}: {error.message}", subject=getattr(error, "subject", "")) from error
    except TypeError as error:  # e.g. unknown RetryPolicy keys
        raise InvalidSpecError(
            f"roster {where} {place}{who}: {error}. Check the field names.", subject=str(raw_identity or where)
        ) from error


def validate_roster(specs: Sequence[AgentSpec], *, existing: Collection[str] = ()) -> None:
    """Check that a roster can be deployed as a whole.

    Guarantees, when it returns: identities are unique, and every peer is either in
    the roster or in ``existing`` (identities the fleet already hosts).

    Raises:
        InvalidSpecError: for the first repeated identity (INV-06), or for the first
            peer that is neither in the roster nor in ``existing``, naming the agent
            and the missing peer.
    """
    known = _unique_identities(specs) | set(existing)
    for spec in specs:
        for peer in spec.peers:
            if peer not in known:
                raise InvalidSpecError(
                    f"agent {spec.identity!r} lists peer {peer!r}, which is neither in the roster nor in the fleet. "
                    f"Add {peer!r} to the roster or spawn it first.",
                    subject=spec.identity,
                )


@dataclass(frozen=True, slots=True, kw_only=True)
class RosterChange:
    """What applying a roster to a fleet would do; computed by :func:`plan_roster`."""

    create: tuple[AgentSpec, ...] = ()
    """Specs whose identity the fleet does not have, in roster order."""
    update: tuple[tuple[AgentSpec, list[str]], ...] = ()
    """Specs that differ from the fleet's, each with the names of the changed fields."""
    unchanged: tuple[str, ...] = ()
    """Identities whose spec is identical, in roster order."""
    prune: tuple[str, ...] = ()
    """Identities the fleet has but the roster does not (only with ``prune=True``), sorted."""

    @property
    def is_empty(self) -> bool:
        """True when applying the roster would change nothing."""
        return not (self.create or self.update or self.prune)


def plan_roster(specs: Sequence[AgentSpec], current: Mapping[str, AgentSpec], *, prune: bool) -> RosterChange:
    """Diff a roster against the specs the fleet hosts now.

    A spec is unchanged when its :meth:`AgentSpec.fingerprint` equals the current
    one; otherwise it is an update listing :meth:`AgentSpec.differences` (which can
    be empty when only a value's representation changed, e.g. ``1`` vs ``1.0``).

    Args:
        specs: The roster.
        current: The fleet's specs by identity.
        prune: Whether identities missing from the roster should be removed.

    Raises:
        InvalidSpecError: if the roster repeats an identity.
    """
    create: list[AgentSpec] = []
    update: list[tuple[AgentSpec, list[str]]] = []
    unchanged: list[str] = []
    seen = _unique_identities(specs)
    for spec in specs:
        old = current.get(spec.identity)
        if old is None:
            create.append(spec)
        elif old.fingerprint() == spec.fingerprint():
            unchanged.append(spec.identity)
        else:
            update.append((spec, old.differences(spec)))
    pruned = tuple(sorted(set(current) - seen)) if prune else ()
    return RosterChange(create=tuple(create), update=tuple(update), unchanged=tuple(unchanged), prune=pruned)


def _unique_identities(specs: Sequence[AgentSpec]) -> set[str]:
    """The identities of a roster; the first repeated one is refused (INV-06)."""
    seen: set[str] = set()
    for spec in specs:
        if spec.identity in seen:
            raise InvalidSpecError(
                f"duplicate identity in roster: {spec.identity!r}. Identities in a roster must be unique; "
                f"remove or rename one.",
                subject=spec.identity,
            )
        seen.add(spec.identity)
    return seen
