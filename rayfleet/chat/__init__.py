"""Model agents: ``rf.ChatAgent``, its ``rf.Model`` and the ``@rf.tool`` methods it offers the model.

Ray-free, like the rest of an agent's definition: the loop runs on durable turns
(``self.step``), so every model call and tool call is journaled by the host it runs on.
``_model`` holds the model's settings, ``_tools`` the tool declarations and their JSON
Schema, ``_agent`` the agent and its loop.
"""
