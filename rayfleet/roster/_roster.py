"""Rosters: YAML or in-code lists of agent specs, their validation and their diff against a fleet.

The shape of a roster is the pydantic model :class:`RosterFile`, a list of
:class:`RosterAgent`; the same model gives editors a JSON Schema. Each item converts
into the core's frozen :class:`AgentSpec`, which keeps the rules about what a valid
agent is; the models only check keys and value types.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import MISSING, dataclass, fields
from typing import Annotated, Any, Literal

import pydantic
import yaml
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import ErrorDetails

from ..errors import InvalidSpecError
from ..identity._agent import AgentSpec
from ..identity._values import Addressability, Durability, TopologyPolicy
from ..retry import RetryPolicy

_TEXT_SOURCE = "<roster text>"
_JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"

RosterSource = str | os.PathLike[str] | Sequence[AgentSpec | Mapping[str, Any]]

# Where pydantic found a problem: field names, item indexes, and its own markers.
_Loc = tuple[int | str, ...]


def _keep_int(value: Any, handler: pydantic.ValidatorFunctionWrapHandler) -> Any:
    # A spec's fingerprint tells 2 from 2.0, so the number goes to the spec as written;
    # otherwise re-applying an unchanged roster would report an update.
    return value if type(value) is int else handler(value)


# Strict: a quoted "2" stays an error, as it is for AgentSpec.
_Number = Annotated[float, pydantic.Strict(), pydantic.WrapValidator(_keep_int)]
_Count = Annotated[int, pydantic.Strict()]


def _default(kind: type[Any], name: str) -> Any:
    """The default the dataclass ``kind`` declares for field ``name``.

    The models below show these defaults in the schema; the values a spec actually
    gets still come from the dataclass, because only the fields a roster sets are
    passed on.
    """
    item = next(item for item in fields(kind) if item.name == name)
    if item.default is not MISSING:
        return item.default
    if item.default_factory is not MISSING:
        return item.default_factory()
    raise LookupError(f"{kind.__name__}.{name} has no default")


class RosterRetry(pydantic.BaseModel, extra="forbid", frozen=True, from_attributes=True):
    """How a handler that raises a retryable error is retried, with exponential backoff."""

    max_attempts: _Count = pydantic.Field(
        default=_default(RetryPolicy, "max_attempts"), description="Attempts in all, the first included (at least 1)."
    )
    base_delay: _Number = pydantic.Field(
        default=_default(RetryPolicy, "base_delay"),
        description="Seconds before the second attempt; doubles after each attempt.",
    )
    max_delay: _Number = pydantic.Field(
        default=_default(RetryPolicy, "max_delay"),
        description="Cap on any one delay, in seconds (at least base_delay).",
    )
    jitter: _Number = pydantic.Field(
        default=_default(RetryPolicy, "jitter"),
        description="Each delay is multiplied by a random factor in [1 - jitter, 1 + jitter]; 0 <= jitter < 1.",
    )

    def to_policy(self) -> RetryPolicy:
        """The :class:`RetryPolicy` this declares.

        Raises:
            InvalidSpecError: if the values break a rule of the policy (e.g. ``max_delay``
                below ``base_delay``).
        """
        return RetryPolicy(**{name: getattr(self, name) for name in self.model_fields_set})


class RosterAgent(pydantic.BaseModel, extra="forbid", frozen=True):
    """One agent of a roster: the AgentSpec fields a roster can carry.

    The model checks keys and value types; to_spec() then applies the rules of
    AgentSpec (identity syntax, an importable agent class, no self peer, ...).
    """

    identity: str = pydantic.Field(
        description="Stable name: 1-200 characters of letters, digits and . _ : / - (not starting with /).",
        examples=["team/planner"],
    )
    # In code an item may name the class itself (AgentSpec checks it is an rf.Agent);
    # YAML, and so the schema, only has the path.
    agent: str | SkipJsonSchema[type] = pydantic.Field(
        description="Import path of the agent class, 'pkg.module:Class'.",
        examples=["rayfleet.demo.agents:Planner"],
    )
    addressability: Addressability = pydantic.Field(
        default=_default(AgentSpec, "addressability"),
        description="INTERNAL_ONLY agents refuse messages from outside the fleet.",
    )
    labels: dict[str, str | int | float | bool] = pydantic.Field(
        default=_default(AgentSpec, "labels"),
        description="Capabilities, used by fleet.list(labels=...) and workflow selectors. Values are kept as text.",
        examples=[{"role": "researcher"}],
    )
    peers: tuple[str, ...] = pydantic.Field(
        default=_default(AgentSpec, "peers"), description="Identities this agent is wired to (not itself)."
    )
    topology: TopologyPolicy = pydantic.Field(
        default=_default(AgentSpec, "topology"),
        description="'enforced' refuses sends to identities that are not wired peers; 'open' allows any.",
    )
    durability: Durability = pydantic.Field(
        default=_default(AgentSpec, "durability"),
        description="When State is committed: after every turn before the reply (EVERY_TURN), "
        "every checkpoint_interval seconds (PERIODIC), or on deactivation (ON_DEACTIVATE).",
    )
    checkpoint_interval: _Number = pydantic.Field(
        default=_default(AgentSpec, "checkpoint_interval"),
        description="Seconds between commits under PERIODIC durability (positive).",
    )
    display_name: str = pydantic.Field(
        default=_default(AgentSpec, "display_name"), description="A human-readable name for listings."
    )
    # Any keys, as AgentSpec takes any mapping here.
    context: dict[Any, Any] = pydantic.Field(
        default=_default(AgentSpec, "context"),
        description="Free-form application context, handed to the agent as self.spec.context.",
    )
    retry: RosterRetry = pydantic.Field(
        default=RosterRetry(), description="How a handler that raises a retryable error is retried."
    )
    dedup_capacity: _Count = pydantic.Field(
        default=_default(AgentSpec, "dedup_capacity"),
        description="How many idempotency keys (and their replies) the agent remembers, oldest evicted first.",
    )
    on_busy: Literal["queue", "steer", "interrupt", "reject"] = pydantic.Field(
        default="queue",
        description="What a message does when the agent has a turn in progress, unless the message says "
                    "(mode=): queue (wait its turn), steer (join the running turn), interrupt (stop it), "
                    "reject (refuse with AgentBusyError).",
    )

    def to_spec(self) -> AgentSpec:
        """The :class:`AgentSpec` this item declares.

        Fields the item does not set take the spec's own defaults.

        Raises:
            InvalidSpecError: from :class:`AgentSpec` or :class:`RetryPolicy`, naming the
                field and the fix (without file or line; :func:`load_roster` adds those).
        """
        values: dict[str, Any] = {name: getattr(self, name) for name in self.model_fields_set}
        if "retry" in values:
            values["retry"] = self.retry.to_policy()
        return AgentSpec(**values)


class RosterFile(pydantic.BaseModel, extra="forbid", frozen=True):
    """A rayfleet roster: the agents a fleet should host, applied with 'rayfleet apply ROSTER'."""

    agents: tuple[RosterAgent, ...] = pydantic.Field(
        description="The agents, in roster order. Identities must be unique."
    )

    def to_specs(self) -> list[AgentSpec]:
        """The specs of the roster, in roster order.

        Raises:
            InvalidSpecError: for the first item :class:`AgentSpec` refuses, or a repeated
                identity (naming both items).
        """
        return _build_specs([(agent, f"item {index}") for index, agent in enumerate(self.agents)], "RosterFile")


def roster_json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a roster file, for editors and CI checks.

    A file the schema accepts has the right keys and value types; :func:`load_roster`
    may still refuse it for what only the spec can check (identity syntax, an agent
    class that does not import, a self peer, a repeated identity).
    """
    return {"$schema": _JSON_SCHEMA_DIALECT, **RosterFile.model_json_schema()}


def load_roster(source: RosterSource) -> list[AgentSpec]:
    """Read a roster into validated specs, in roster order.

    ``source`` may be a path to a YAML file (a ``str`` is taken as a path if it names an
    existing file or ends in ``.yaml``/``.yml``), YAML text (a ``str`` containing a
    newline), or a list of :class:`AgentSpec` and/or mappings of spec fields. The YAML
    shape is :class:`RosterFile`: a mapping with an ``agents`` list whose items are
    :class:`RosterAgent` mappings (``identity``, ``agent`` as ``"pkg.module:Class"``,
    ``labels``, ``peers``, ...).

    An agent path may name a module beside the roster file (``agent: my_agents:Echo``
    with ``my_agents.py`` next to ``team.yaml``): while a roster file loads, its folder
    comes first on ``sys.path``, as a script's folder does. Such modules are not
    installed on the cluster, so the fleet ships their classes to the hosts by value.

    Only the roster itself is checked here (fields, duplicates); whether every peer
    exists depends on the fleet, so call :func:`validate_roster` for that.

    Raises:
        InvalidSpecError: naming the file (or ``<roster text>``), the line of the
            offending item and its identity, for: a missing file, invalid YAML, a top
            level that is not a mapping with an ``agents`` list (or has other keys), an
            item that is not a mapping, unknown or missing keys, a value of the wrong
            type, a field the spec refuses (including an agent class that cannot be
            imported), or a repeated identity (both lines are named).
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
                f"cannot read roster file {path!r}: {error.strerror or error}. Check the path.", field=path
            ) from None
        with _modules_beside(path):
            return _load_yaml(text, path)
    if isinstance(source, str):
        if "\n" in source:
            return _load_yaml(source, _TEXT_SOURCE)
        raise InvalidSpecError(
            f"roster file {source!r} does not exist. Pass an existing .yaml/.yml path, YAML text, "
            f"or a list of AgentSpec.",
            field=source,
        )
    if isinstance(source, Sequence):
        return _build_specs([(item, f"item {index}") for index, item in enumerate(source)], "roster list")
    raise InvalidSpecError(
        f"a roster must be a YAML path, YAML text, or a list of AgentSpec or mappings, got {type(source).__name__}",
        field="roster",
    )


@contextlib.contextmanager
def _modules_beside(path: str) -> Iterator[None]:
    """Make the modules in a roster file's folder importable while its agent paths are resolved.

    The folder leaves ``sys.path`` afterwards; what was imported stays in ``sys.modules``.
    """
    folder = os.path.dirname(os.path.abspath(path))
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)
    # A module written since the folder was last scanned would otherwise stay invisible.
    importlib.invalidate_caches()
    try:
        yield
    finally:
        if added:
            with contextlib.suppress(ValueError):
                sys.path.remove(folder)


def _is_file(text: str) -> bool:
    try:
        return "\n" not in text and os.path.isfile(text)
    except (OSError, ValueError):
        return False


def _load_yaml(text: str, where: str) -> list[AgentSpec]:
    loader: yaml.SafeLoader | None = None
    try:
        # Built inside the try: the reader refuses control characters as soon as it is made.
        loader = yaml.SafeLoader(text)
        # One parse gives both the node tree (for line numbers) and the Python values.
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
        place = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error)
        raise InvalidSpecError(
            f"roster {where}{place}: invalid YAML ({problem}). Fix the syntax there.", field=where
        ) from None
    finally:
        if loader is not None:
            loader.dispose()
    item_lines = _agent_item_lines(node)

    def item_place(index: int) -> str:
        return f"line {item_lines[index]}" if index < len(item_lines) else f"item {index}"

    try:
        roster = RosterFile.model_validate(data)
    except pydantic.ValidationError as error:
        raise _file_error(error.errors(), data, where, item_place) from None
    return _build_specs([(agent, item_place(index)) for index, agent in enumerate(roster.agents)], where)


def _agent_item_lines(node: yaml.Node | None) -> list[int]:
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
        spec = item if isinstance(item, AgentSpec) else _spec_from_item(item, where, place)
        if spec.identity in seen:
            raise InvalidSpecError(
                f"roster {where}: duplicate identity {spec.identity!r} at {seen[spec.identity]} and {place} "
                f"(identities in a roster must be unique). Remove or rename one of them.",
                field=spec.identity,
            )
        seen[spec.identity] = place
        specs.append(spec)
    return specs


def _spec_from_item(item: object, where: str, place: str) -> AgentSpec:
    """Validate one roster item (a mapping, or an already validated :class:`RosterAgent`)."""
    try:
        agent = RosterAgent.model_validate(item)
    except pydantic.ValidationError as error:
        raise _item_error([(problem["loc"], problem) for problem in error.errors()], item, where, place) from None
    try:
        return agent.to_spec()
    except InvalidSpecError as error:
        raise InvalidSpecError(
            f"roster {where} {place} (identity {agent.identity!r}): {error.message}",
            field=error.field,
        ) from error


def _file_error(
    problems: list[ErrorDetails], data: object, where: str, place: Callable[[int], str]
) -> InvalidSpecError:
    """One error for a roster file the model refused: the top level first, else the first bad item."""
    top: list[ErrorDetails] = []
    by_item: dict[int, list[tuple[_Loc, ErrorDetails]]] = {}
    for problem in problems:
        loc = problem["loc"]
        if len(loc) >= 2 and loc[0] == "agents" and isinstance(loc[1], int):
            by_item.setdefault(loc[1], []).append((loc[2:], problem))
        else:
            top.append(problem)
    unknown = [str(problem["loc"][0]) for problem in top if problem["type"] == "extra_forbidden"]
    if len(unknown) < len(top) or not isinstance(data, Mapping):
        return InvalidSpecError(
            f"roster {where}: the top level must be a mapping with an 'agents' list, e.g.\n"
            f"agents:\n  - identity: team/planner\n    agent: mypkg.agents:Planner",
            field=where,
        )
    if unknown:
        return InvalidSpecError(
            f"roster {where}: unknown top-level key(s) {', '.join(unknown)}. "
            f"A roster has a single top-level key, 'agents'; remove the others.",
            field=where,
        )
    index = min(by_item)
    agents = data.get("agents")
    if not isinstance(agents, (list, tuple)):
        # e.g. a YAML !!set, which pydantic reads as a sequence but which has no item order to point at
        return InvalidSpecError(
            f"roster {where}: 'agents' must be a YAML list of agents (one '- identity: ...' item each), "
            f"got {type(agents).__name__}",
            field=where,
        )
    return _item_error(by_item[index], agents[index], where, place(index))


def _item_error(
    problems: Sequence[tuple[_Loc, ErrorDetails]], item: object, where: str, place: str
) -> InvalidSpecError:
    """One error naming every problem pydantic found in one roster item.

    ``problems`` pairs each pydantic error with its location inside the item.
    """
    if any(not loc for loc, _ in problems):
        return InvalidSpecError(
            f"roster {where} {place}: each agent must be a mapping of spec fields "
            f"(identity, agent, ...), got {type(item).__name__} {item!r}",
            field=where,
        )
    raw_identity = item.get("identity") if isinstance(item, Mapping) else None
    who = f" (identity {raw_identity!r})" if raw_identity is not None else ""
    by_identity = str(raw_identity or where)
    unknown: dict[_Loc, list[str]] = {}
    missing: list[str] = []
    wrong: dict[str, str] = {}
    wrong_fields: list[str] = []
    for loc, problem in problems:
        if problem["type"] == "extra_forbidden":
            unknown.setdefault(loc[:-1], []).append(_dotted(loc))
        elif problem["type"] == "missing":
            missing.append(_dotted(loc))
        else:
            path, is_key = _key_path(item, loc)
            # A union reports once per member; its first member's message is the advice.
            wrong.setdefault(path, f"{path}{' key' if is_key else ''} {problem['input']!r}: {_message(problem)}")
            wrong_fields.append(str(loc[0]))
    # Keys of the item itself first, then those of nested fields.
    texts = [
        f"unknown key(s) {', '.join(names)}. Allowed keys{f' for {_dotted(parent)}' if parent else ''}: "
        f"{', '.join(_allowed_keys(parent))}"
        for parent, names in sorted(unknown.items(), key=lambda entry: len(entry[0]))
    ]
    if missing:
        texts.append(
            f"missing required key(s) {', '.join(missing)}. "
            f"Every agent needs an identity and an agent class path 'pkg.module:Class'"
        )
    texts.extend(wrong.values())
    # The field follows the first problem named: a key problem is the item's, a bad value its field's.
    field = by_identity if unknown or missing else wrong_fields[0]
    return InvalidSpecError(f"roster {where} {place}{who}: {'; '.join(texts)}.", field=field)


def _key_path(item: object, loc: _Loc) -> tuple[str, bool]:
    """The dotted keys of ``loc`` that exist in ``item``, and whether the error is about a key.

    Pydantic's locations also hold union members ('str', 'int', ...) and '[key]'; walking
    the data keeps only what the user wrote.
    """
    names: list[str] = []
    current: Any = item
    for part in loc:
        in_mapping = isinstance(current, Mapping) and part in current
        in_list = isinstance(current, (list, tuple)) and isinstance(part, int) and 0 <= part < len(current)
        if not (in_mapping or in_list):
            return ".".join(names), part == "[key]"
        current = current[part]
        names.append(str(part))
    return ".".join(names), False


def _message(problem: ErrorDetails) -> str:
    # Tuples are how the model keeps sequences frozen; in YAML they are lists.
    return "Input should be a list" if problem["type"] == "tuple_type" else problem["msg"]


def _dotted(loc: _Loc) -> str:
    return ".".join(str(part) for part in loc)


def _allowed_keys(parent: _Loc) -> list[str]:
    """The keys the model at ``parent`` (a path of field names inside an item) accepts."""
    model: type[pydantic.BaseModel] = RosterAgent
    for name in parent:
        annotation = model.model_fields[str(name)].annotation if str(name) in model.model_fields else None
        if not (isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel)):
            return []
        model = annotation
    return list(model.model_fields)


def validate_roster(specs: Sequence[AgentSpec], *, existing: Collection[str] = ()) -> None:
    """Check that a roster can be deployed as a whole.

    Guarantees, when it returns: identities are unique, and every peer is either in
    the roster or in ``existing`` (identities the fleet already hosts).

    Raises:
        InvalidSpecError: for the first repeated identity, or for the first peer that
            is neither in the roster nor in ``existing``, naming the agent and the
            missing peer.
    """
    known = _unique_identities(specs) | set(existing)
    for spec in specs:
        for peer in spec.peers:
            if peer not in known:
                raise InvalidSpecError(
                    f"agent {spec.identity!r} lists peer {peer!r}, which is neither in the roster nor in the fleet. "
                    f"Add {peer!r} to the roster or spawn it first.",
                    field=spec.identity,
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
    """The identities of a roster; the first repeated one is refused."""
    seen: set[str] = set()
    for spec in specs:
        if spec.identity in seen:
            raise InvalidSpecError(
                f"duplicate identity in roster: {spec.identity!r}. Identities in a roster must be unique; "
                f"remove or rename one.",
                field=spec.identity,
            )
        seen.add(spec.identity)
    return seen
