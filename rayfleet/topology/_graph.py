"""Undirected peer edges between identities, and the desired graph built from specs."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..errors import InvalidSpecError
from ..identity._agent import AgentSpec
from ..identity._names import validate_identity


@dataclass(frozen=True, slots=True, kw_only=True, order=True)
class Edge:
    """An undirected wire between two identities, stored canonically with ``a < b``.

    Two edges are equal exactly when they join the same two identities, so edges
    can be compared and collected in sets regardless of the order they were named in.
    Build one with :meth:`Edge.of` when the endpoint order is not known.

    Raises:
        InvalidSpecError: on construction, if either endpoint is not a valid identity,
            both endpoints are the same identity, or ``a`` does not sort before ``b``.
    """

    a: str
    b: str

    def __post_init__(self) -> None:
        validate_identity(self.a)
        validate_identity(self.b)
        if self.a == self.b:
            raise InvalidSpecError(
                f"edge {self.a!r} -- {self.b!r} joins {self.a!r} to itself: an agent cannot be its own peer. "
                f"Remove {self.a!r} from its own peers.",
                field=self.a,
            )
        if self.a > self.b:
            # A non-canonical edge would compare unequal to its mirror and break set arithmetic.
            raise InvalidSpecError(
                f"edge {self.a!r} -- {self.b!r} is not canonical (a must sort before b). "
                f"Build it with Edge.of({self.a!r}, {self.b!r}).",
                field=self.a,
            )

    @classmethod
    def of(cls, x: str, y: str) -> Edge:
        """The canonical edge joining ``x`` and ``y``, in either order.

        Raises:
            InvalidSpecError: if an endpoint is not a valid identity or ``x == y``.
        """
        return cls(a=x, b=y) if isinstance(x, str) and isinstance(y, str) and x <= y else cls(a=y, b=x)

    def other(self, identity: str) -> str:
        """The endpoint that is not ``identity``.

        Raises:
            ValueError: if ``identity`` is not an endpoint of this edge.
        """
        if identity == self.a:
            return self.b
        if identity == self.b:
            return self.a
        raise ValueError(f"{identity!r} is not an endpoint of edge {self}")

    def __str__(self) -> str:
        return f"{self.a} -- {self.b}"



@dataclass(frozen=True, slots=True, kw_only=True, order=True)
class LiveEdge:
    """A wired edge as the fleet has it now: its endpoints (``a < b``) and whether the platform manages it.

    Managed edges were wired by reconciliation and are unwired by it; unmanaged ones
    were found live and are left alone.
    """

    a: str
    b: str
    managed: bool

    @property
    def edge(self) -> Edge:
        return Edge(a=self.a, b=self.b)


def desired_edges(specs: Iterable[AgentSpec], explicit: Iterable[Edge] = ()) -> frozenset[Edge]:
    """The desired topology: one edge per (spec, peer) pair, plus the explicit edges.

    A peer listed by both endpoints yields a single edge. Peers need not be in
    ``specs``; use :func:`~rayfleet.topology.validate_roster` to insist they exist.

    Raises:
        InvalidSpecError: if an explicit item is not an :class:`Edge` or an
            ``(identity, identity)`` pair, or a pair is not a valid edge.
    """
    edges: set[Edge] = set()
    for spec in specs:
        # AgentSpec already validated its peers and refused self-peers.
        edges.update(Edge.of(spec.identity, peer) for peer in spec.peers)
    for item in explicit:
        if isinstance(item, Edge):
            edges.add(item)
        elif isinstance(item, tuple) and len(item) == 2:
            edges.add(Edge.of(item[0], item[1]))
        else:
            raise InvalidSpecError(
                f"explicit edge {item!r} is not an Edge or an (identity, identity) pair; "
                f"build it with Edge.of('a', 'b').",
                field="edges",
            )
    return frozenset(edges)


def peers_of(identity: str, edges: Iterable[Edge]) -> tuple[str, ...]:
    """The identities joined to ``identity`` by ``edges``, sorted and without repeats."""
    return tuple(sorted({edge.other(identity) for edge in edges if identity in (edge.a, edge.b)}))
