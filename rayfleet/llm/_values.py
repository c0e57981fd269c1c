"""The values of a chat conversation: messages, tool calls, replies and streamed deltas.

They follow the OpenAI chat completions protocol field for field, so a transcript built
from them is what every compatible server (OpenAI, vLLM, Ray Serve LLM, LiteLLM's proxy)
accepts back: an assistant message that asked for tools is followed by one ``tool``
message per call id.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ..errors import InvalidSpecError
from ..identity._handlers import Reply, Usage


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call a model asked for.

    Attributes:
        id: the call id the model gave it; the ``tool`` message answering it names it.
        name: the tool (function) to call.
        arguments: the arguments as the model wrote them: a JSON text, not checked here
            (a model may write invalid JSON; :meth:`parsed_arguments` says so).

    Raises:
        InvalidSpecError: an empty id or name, or arguments that are not a string.
    """

    id: str
    name: str
    arguments: str = "{}"

    def __post_init__(self) -> None:
        for label, value in (("id", self.id), ("name", self.name)):
            if not isinstance(value, str) or not value:
                raise InvalidSpecError(f"a tool call needs a non-empty string {label}, got {value!r}",
                                       field="tool_calls")
        if not isinstance(self.arguments, str):
            raise InvalidSpecError(f"tool call arguments must be a JSON string, got {type(self.arguments).__name__}",
                                   field="tool_calls")

    def parsed_arguments(self) -> dict[str, Any]:
        """The arguments decoded; an empty text counts as ``{}``.

        Raises:
            ValueError: they are not a JSON object (the message says what they are).
        """
        if not self.arguments.strip():
            return {}
        try:
            decoded = json.loads(self.arguments)
        except ValueError as error:
            raise ValueError(f"the arguments of tool call {self.id} ({self.name}) are not JSON: {error}") from None
        if not isinstance(decoded, dict):
            raise ValueError(f"the arguments of tool call {self.id} ({self.name}) must be a JSON object, got "
                             f"{type(decoded).__name__}")
        return decoded

    def to_json(self) -> dict[str, Any]:
        """The call as an assistant message lists it."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One message of a chat conversation.

    Attributes:
        role: who speaks: ``"system"``, ``"user"``, ``"assistant"``, ``"tool"`` or another
            role the server knows.
        content: the text of the message (``""`` for an assistant message that only
            calls tools; it is sent as ``null`` then).
        tool_calls: the tools an assistant message asks for.
        tool_call_id: the call a ``tool`` message answers (required for that role).
        name: the participant's or tool's name, when the server uses one.

    Raises:
        InvalidSpecError: an empty role, a field of the wrong type, tool calls on a
            message that is not the assistant's, or a ``tool`` message without its call id.
    """

    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.role, str) or not self.role:
            raise InvalidSpecError(f"a chat message needs a non-empty string role, got {self.role!r}",
                                   field="messages")
        if not isinstance(self.content, str):
            raise InvalidSpecError(
                f"chat message content must be a string, got {type(self.content).__name__}", field="messages"
            )
        if not isinstance(self.tool_calls, tuple) or not all(isinstance(c, ToolCall) for c in self.tool_calls):
            raise InvalidSpecError("tool_calls must be a tuple of rf.ToolCall", field="messages")
        if self.tool_calls and self.role != "assistant":
            raise InvalidSpecError(f"only an assistant message calls tools, not a {self.role!r} one",
                                   field="messages")
        if self.role == "tool" and not (isinstance(self.tool_call_id, str) and self.tool_call_id):
            raise InvalidSpecError("a tool message needs the tool_call_id of the call it answers", field="messages")
        for label, value in (("tool_call_id", self.tool_call_id), ("name", self.name)):
            if value is not None and (not isinstance(value, str) or not value):
                raise InvalidSpecError(f"chat message {label} must be a non-empty string or None, got {value!r}",
                                       field="messages")

    def to_json(self) -> dict[str, Any]:
        """The message as the chat completions API expects it."""
        message: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            message["content"] = self.content or None
            message["tool_calls"] = [call.to_json() for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            message["name"] = self.name
        return message

    @classmethod
    def tool_result(cls, call: ToolCall, content: str) -> ChatMessage:
        """The ``tool`` message answering ``call`` with ``content``."""
        return cls("tool", content, tool_call_id=call.id)


@dataclass(frozen=True, slots=True)
class ChatReply:
    """What a chat model answered, with the tokens it cost.

    Attributes:
        text: the content of the first choice (``""`` when it only called tools).
        usage: prompt and completion tokens as the server reported them (zeros if it did not;
            a streamed reply has them only when the request asked for
            ``stream_options={"include_usage": True}``, which :meth:`ChatClient.stream` does).
        model: the model that answered, as the server named it.
        finish_reason: why generation stopped (``"stop"``, ``"length"``, ``"tool_calls"``, ...), if reported.
        raw: the decoded response body, for fields this class does not surface (for a
            streamed reply: the last chunk).
        tool_calls: the tools the model asked for, in its order; several are parallel calls.
    """

    text: str
    usage: Usage
    model: str
    finish_reason: str | None = None
    raw: dict[str, Any] = field(default_factory=dict)
    tool_calls: tuple[ToolCall, ...] = ()

    @property
    def message(self) -> ChatMessage:
        """The reply as the assistant message a transcript keeps (tool calls included)."""
        return ChatMessage("assistant", self.text, tool_calls=self.tool_calls)


@dataclass(frozen=True, slots=True)
class ChatDelta:
    """One piece of a streamed reply, as it arrived.

    A text delta has ``text``; a tool-call delta has ``tool_index`` (which call of the
    reply it belongs to) and any of ``tool_call_id`` and ``tool_name`` (sent with a
    call's first delta) and ``arguments`` (the next fragment of its JSON arguments).
    The reply assembled from all of them is the stream's ``reply``.
    """

    text: str = ""
    tool_index: int | None = None
    tool_call_id: str | None = None
    tool_name: str | None = None
    arguments: str = ""


@runtime_checkable
class ChatModel(Protocol):
    """Anything a handler can chat with: :class:`ChatClient`, :class:`ScriptedModel` or your own."""

    async def chat(self, messages: Iterable[ChatMessage | Mapping[str, Any]], **params: Any) -> ChatReply:
        """Answer ``messages``; ``params`` are model parameters such as ``temperature``."""
        ...


def reply_with_usage(reply: ChatReply) -> Reply:
    """Wrap a chat reply as a handler :class:`Reply` so workflow token budgets count it.

    Example::

        return rf.reply_with_usage(await model.chat([{"role": "user", "content": question}]))
    """
    return Reply(reply.text, usage=reply.usage)


def coerce_messages(messages: Iterable[ChatMessage | Mapping[str, Any]]) -> list[ChatMessage]:
    """``messages`` as :class:`ChatMessage` values; dicts take the protocol's fields.

    Raises:
        InvalidSpecError: naming the message (by index) that is malformed, or an empty list.
    """
    # A bare string or dict is iterable too; refusing them here beats sending one message per character.
    if isinstance(messages, (str, bytes, Mapping)):
        raise InvalidSpecError(
            "messages must be a list of ChatMessage or {'role': ..., 'content': ...} dicts, "
            f"got a single {type(messages).__name__}",
            field="messages",
        )
    coerced: list[ChatMessage] = []
    for index, message in enumerate(messages):
        if isinstance(message, ChatMessage):
            coerced.append(message)
        elif isinstance(message, Mapping):
            coerced.append(_from_mapping(index, message))
        else:
            raise InvalidSpecError(
                f"message {index} must be a ChatMessage or a dict, got {type(message).__name__}", field="messages"
            )
    if not coerced:
        raise InvalidSpecError("messages is empty; send at least one message", field="messages")
    return coerced


def _from_mapping(index: int, message: Mapping[str, Any]) -> ChatMessage:
    calls_json = message.get("tool_calls") or ()
    # An assistant message that only calls tools may carry "content": null, as the protocol has it.
    required = ("role",) if calls_json else ("role", "content")
    missing = [key for key in required if key not in message]
    if missing:
        raise InvalidSpecError(f"message {index} lacks {', '.join(missing)}: {dict(message)!r}", field="messages")
    try:
        calls = tuple(ToolCall(id=call["id"], name=call["function"]["name"],
                               arguments=call["function"].get("arguments", "{}")) for call in calls_json)
    except (KeyError, TypeError, AttributeError):
        raise InvalidSpecError(
            f"message {index} has a malformed tool call; each is {{'id': ..., 'type': 'function', "
            f"'function': {{'name': ..., 'arguments': '<json>'}}}}, got {calls_json!r}",
            field="messages",
        ) from None
    content: Any = message.get("content")
    return ChatMessage(message["role"], "" if content is None and calls else content, tool_calls=calls,
                       tool_call_id=message.get("tool_call_id"), name=message.get("name"))
