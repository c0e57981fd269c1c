"""The per-host runtime: activation, leases and renewal, the delivery gates, pause/park, dedup, events.

Ray-free: ``rayfleet.platform`` wraps a ``HostRuntime`` in a Ray actor. Internal.
"""
