"""``rf.peer_tool`` and ``rf.handoff``: other agents offered to a model as tools, called exactly once per tool call.

The tool's schema is the peer's handler's own arguments model, read from the peer's
agent class on the host when a turn first needs it: the model sees what the handler
takes, and a call's arguments are validated by the same model the peer's host validates
with. Each call is delivered with the tool call's key (``identity:turn:tool_call_id``)
as its idempotency key, so a call repeated after a failover gets the peer's first reply
instead of a second turn.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pydantic

from ..errors import InvalidSpecError
from ..identity._handlers import HandlerInfo, handler_name
from ..identity._names import validate_identity
from ._tools import NAME_PATTERN, ToolSpec, summary_of


@dataclass(frozen=True, slots=True)
class PeerTool:
    """A peer's handler as a tool (made by :func:`peer_tool`)."""

    target: str
    method: str
    approval: bool = False
    name: str | None = None
    description: str | None = None

    @property
    def tool_name(self) -> str:
        return self.name or self.method

    def spec(self, handler: HandlerInfo | None) -> ToolSpec:
        """The tool as the model sees it, from the peer's handler.

        Raises:
            InvalidSpecError: the peer has no handler of that name.
        """
        if handler is None:
            raise InvalidSpecError(f"peer tool {self.tool_name!r}: agent {self.target!r} has no handler "
                                   f"{self.method!r}", field="tools")
        parameters = handler.arguments_model.model_json_schema()
        parameters.pop("title", None)
        description = self.description or summary_of(inspect.getdoc(handler.function) or "") or self.tool_name
        return ToolSpec(name=self.tool_name, description=description, parameters=parameters,
                        arguments=handler.arguments_model, method=self.method, idempotent=True,
                        approval=self.approval, peer=self.target)


def peer_tool(target: str, method: str | Callable[..., Any], /, *, approval: bool = False, name: str | None = None,
              description: str | None = None) -> PeerTool:
    """Offer handler ``method`` of agent ``target`` to a ``rf.ChatAgent``'s model as a tool.

    ``method`` is the handler's name or the handler itself (``Billing.refund``). The
    tool's name is the handler's (or ``name``), its description the handler's docstring's
    first paragraph (or ``description``), its parameters the handler's. A call is a
    message to the peer under the tool call's key as its idempotency key: exactly once,
    also when the calling turn runs again after a failover. The peer's errors are told to
    the model as the call's result. ``approval=True`` puts each call to a person first,
    as for ``@rf.tool``. The sender's topology rules apply (an ``ENFORCED`` agent must be
    wired to the peer).

    Raises:
        InvalidSpecError: a malformed identity or tool name. A peer that does not exist, or
            has no such handler, fails the turn that first offers the tool, naming it.
    """
    validate_identity(target)
    method_name = handler_name(method)
    tool = PeerTool(target=target, method=method_name, approval=approval, name=name, description=description)
    if not NAME_PATTERN.match(tool.tool_name):
        raise InvalidSpecError(f"peer tool {tool.tool_name!r}: a tool name is letters, digits, '_' or '-' (at most "
                               f"64); pass name=", field="tools")
    return tool


TAKE_OVER = "take_over"
"""The ``rf.ChatAgent`` handler a handoff calls on the agent that takes the conversation over."""


class HandoffArguments(pydantic.BaseModel):
    """What a model passes when it hands a conversation over."""

    model_config = pydantic.ConfigDict(extra="forbid")

    note: str = pydantic.Field("", description="What the next agent should know that the conversation does not say.")


@dataclass(frozen=True, slots=True)
class Handoff:
    """Another chat agent the conversation can be handed over to (made by :func:`handoff`)."""

    target: str
    name: str | None = None
    description: str | None = None

    @property
    def tool_name(self) -> str:
        return self.name or ("transfer_to_" + re.sub(r"[^A-Za-z0-9_-]", "_", self.target))[:64]

    def spec(self) -> ToolSpec:
        parameters = HandoffArguments.model_json_schema()
        parameters.pop("title", None)
        description = self.description or (f"Hand the conversation over to {self.target}, who answers the user "
                                           f"from here on.")
        return ToolSpec(name=self.tool_name, description=description, parameters=parameters,
                        arguments=HandoffArguments, method=TAKE_OVER, idempotent=True, approval=False,
                        peer=self.target, handoff=True)


def handoff(target: str, /, *, name: str | None = None, description: str | None = None) -> Handoff:
    """Let a ``rf.ChatAgent``'s model hand the conversation over to chat agent ``target``.

    Offered as a tool (``transfer_to_<target>`` unless ``name``). When the model calls
    it, ``target`` receives the conversation's user and assistant messages (not the tool
    calls, which were this agent's) and answers from there in its own turn
    (``take_over``); the calling turn returns that answer, with both turns' usage, and
    makes no further model call. The call is a message under the tool call's key: exactly
    once, also when the calling turn runs again after a failover. A handoff that fails
    (an unknown identity, an agent that is not a chat agent) is told to the model as the
    call's result, and the loop goes on. One handoff per model reply: another in the same
    reply is refused.

    Raises:
        InvalidSpecError: a malformed identity or tool name.
    """
    validate_identity(target)
    made = Handoff(target=target, name=name, description=description)
    if not NAME_PATTERN.match(made.tool_name):
        raise InvalidSpecError(f"handoff {made.tool_name!r}: a tool name is letters, digits, '_' or '-' (at most 64); "
                               f"pass name=", field="tools")
    return made
