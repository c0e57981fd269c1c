"""What applying a roster did: the report ``fleet.apply`` returns."""

from __future__ import annotations

from dataclasses import dataclass

from ..topology._reconcile import ReconcileReport


@dataclass(frozen=True, slots=True, kw_only=True)
class ApplyReport:
    """What ``fleet.apply`` did (or, with ``dry_run``, would do)."""

    created: tuple[str, ...]
    updated: dict[str, list[str]]
    """Identity to the names of the spec fields that changed."""
    unchanged: tuple[str, ...]
    retired: tuple[str, ...]
    topology: ReconcileReport | None
    """The reconciliation that followed; ``None`` for a dry run."""
    dry_run: bool

    @property
    def changed(self) -> bool:
        return bool(self.created or self.updated or self.retired or (self.topology and self.topology.changed))
