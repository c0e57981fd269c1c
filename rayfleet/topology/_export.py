"""Render the peer graph as Graphviz DOT, Mermaid or JSON."""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping

from ..errors import InvalidSpecError
from ._graph import Edge

FORMATS: tuple[str, ...] = ("dot", "json", "mermaid")
# Endpoints of an edge that ``nodes`` does not describe still get a node, so no edge dangles.
_UNKNOWN_STATE = "UNKNOWN"


def export_topology(
    nodes: Mapping[str, str],
    edges: Iterable[Edge],
    *,
    managed: Collection[Edge] = (),
    fmt: str,
) -> str:
    """Render identities (with their lifecycle state) and the edges between them.

    Output is deterministic: nodes and edges are sorted, so equal graphs render to
    equal text. Edges not in ``managed`` are marked as unmanaged (dashed in DOT and
    Mermaid, ``"managed": false`` in JSON). An edge endpoint missing from ``nodes``
    is shown with state ``UNKNOWN``.

    Args:
        nodes: Identity → lifecycle state name (e.g. ``"ACTIVE"``).
        edges: The edges to draw (typically the live ones).
        managed: The edges the runtime manages.
        fmt: ``"dot"``, ``"mermaid"`` or ``"json"``.

    Raises:
        InvalidSpecError: if ``fmt`` is not one of the formats.
    """
    kind = fmt.lower() if isinstance(fmt, str) else fmt
    if kind not in FORMATS:
        raise InvalidSpecError(
            f"unknown topology export format {fmt!r}. Use one of: {', '.join(FORMATS)}.", field="fmt"
        )
    edge_list = sorted(set(edges))
    managed_set = frozenset(managed)
    states = {identity: str(state) for identity, state in nodes.items()}
    for edge in edge_list:
        states.setdefault(edge.a, _UNKNOWN_STATE)
        states.setdefault(edge.b, _UNKNOWN_STATE)
    ordered = sorted(states.items())
    if kind == "json":
        return _json(ordered, edge_list, managed_set)
    if kind == "dot":
        return _dot(ordered, edge_list, managed_set)
    return _mermaid(ordered, edge_list, managed_set)


def _json(nodes: list[tuple[str, str]], edges: list[Edge], managed: frozenset[Edge]) -> str:
    document = {
        "nodes": [{"identity": identity, "state": state} for identity, state in nodes],
        "edges": [{"a": edge.a, "b": edge.b, "managed": edge in managed} for edge in edges],
    }
    return json.dumps(document, indent=2, sort_keys=True)


def _dot_quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _dot(nodes: list[tuple[str, str]], edges: list[Edge], managed: frozenset[Edge]) -> str:
    lines = ["graph rayfleet {", "  node [shape=box];"]
    for identity, state in nodes:
        # The label joins quoted parts with DOT's own \n escape, which renders as a line break.
        label = _dot_quote(identity)[:-1] + "\\n" + _dot_quote(state)[1:]
        lines.append(f"  {_dot_quote(identity)} [label={label}];")
    for edge in edges:
        style = "" if edge in managed else " [style=dashed]"
        lines.append(f"  {_dot_quote(edge.a)} -- {_dot_quote(edge.b)}{style};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _mermaid_text(text: str) -> str:
    # Mermaid labels are double-quoted; entity codes keep quotes and markup inert.
    return (text.replace("&", "#amp;").replace('"', "#quot;").replace("<", "#lt;").replace(">", "#gt;"))


def _mermaid(nodes: list[tuple[str, str]], edges: list[Edge], managed: frozenset[Edge]) -> str:
    # Identities contain / : . - which Mermaid ids cannot; positional ids are always safe.
    ids = {identity: f"n{index}" for index, (identity, _) in enumerate(nodes)}
    lines = ["graph LR"]
    for identity, state in nodes:
        lines.append(f'  {ids[identity]}["{_mermaid_text(identity)}<br/>{_mermaid_text(state)}"]')
    for edge in edges:
        link = "---" if edge in managed else "-.-"
        lines.append(f"  {ids[edge.a]} {link} {ids[edge.b]}")
    return "\n".join(lines) + "\n"
