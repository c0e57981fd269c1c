"""Who an agent is: identity names, ``AgentSpec``, the Agent/State/handler model and value types.

Plain Python (no Ray, no I/O). Its public names are exported from :mod:`rayfleet`.
"""
