"""Topology: desired and managed peer edges between identities (plain asyncio, no Ray).

The reconciler, rosters and exports arrive with issue 4; today a spec's ``peers``
are handed to agents as ``self.peers``.
"""

from __future__ import annotations

__all__: list[str] = []
