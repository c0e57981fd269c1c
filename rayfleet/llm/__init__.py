"""LLM access for agents: an OpenAI-compatible chat client and an offline scripted model.

Plain asyncio over aiohttp, no Ray. ``ChatClient`` and its values are exported from
:mod:`rayfleet`; ``ScriptedModel`` from :mod:`rayfleet.testing`.
"""
