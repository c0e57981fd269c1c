"""LLM access for agents: an OpenAI-compatible chat client, and offline models for tests and demos.

Plain asyncio over aiohttp, no Ray. ``ChatClient`` and its values are exported from
:mod:`rayfleet`; ``ScriptedModel`` (in-process) and ``ScriptedModelServer`` (a real
HTTP server answering from a script) from :mod:`rayfleet.testing`. The modules:
``_values`` (messages, tool calls, replies, deltas), ``_completions`` (the wire format),
``_chat`` (the HTTP client), ``_scripted`` and ``_scripted_server``.
"""
