"""The per-host runtime: activation, leases and renewal, the delivery gates, pause/park, dedup, events.

Ray-free, so all of it runs and is tested in plain asyncio: ``rayfleet.platform``
wraps a ``HostRuntime`` in a Ray actor. ``HostRuntime`` (``_runtime.py``) owns the
agents, their leases and background work; ``Delivery`` (``_delivery.py``) is the
message path it builds and delegates to, reaching back only through the
``ActivationPort`` Protocol (``_ports.py``). Internal: nothing is exported here.
"""
