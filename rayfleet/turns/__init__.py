"""Durable turns: the journal of a turn's steps and waits, replay, suspension, approvals and turn streams.

Ray-free, like ``host``: the host runs a turn through a :class:`~rayfleet.turns._context.TurnContext`
(or plainly, when the handler journals nothing), and the platform wakes suspended turns.
"""
