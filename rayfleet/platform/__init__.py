"""Everything that imports Ray: the ledger, host and runner actors, routing, ``Fleet`` and ``AgentRef``.

Its public names are exported from :mod:`rayfleet`.
"""
