"""The chat completions wire format: request bodies, replies, and streamed chunks assembled into a reply.

Pure functions and one assembler, no I/O: the client feeds them what the server sent.
Every malformed part of a response is a :class:`~rayfleet.errors.ModelResponseError`
naming the part, with an excerpt.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidSpecError, ModelResponseError
from ..identity._handlers import Usage
from ._values import ChatDelta, ChatMessage, ChatReply, ToolCall, coerce_messages

EXCERPT = 200
"""Characters of a response body quoted in an error message."""
TOOL_CHOICES = ("auto", "none", "required")
"""The string values of ``tool_choice``; a dict names one function instead."""
DONE = "[DONE]"
"""The data of the server-sent event that ends a stream."""


def excerpt(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= EXCERPT else flat[:EXCERPT] + "..."


# --------------------------------------------------------------------------- requests


def request_body(model: str, messages: Iterable[ChatMessage | Mapping[str, Any]], params: Mapping[str, Any],
                 *, stream: bool) -> str:
    """The JSON body of one request; ``params`` are sent as given after ``tools`` and ``tool_choice`` are checked.

    A streamed request asks for usage in its last chunk (``stream_options.include_usage``)
    unless ``params`` says otherwise.

    Raises:
        InvalidSpecError: a reserved or malformed parameter, or malformed messages; nothing was sent.
    """
    reserved = sorted(set(params) & {"model", "messages", "stream"})
    if reserved:
        raise InvalidSpecError(
            f"chat parameters cannot include {', '.join(reserved)}: the model is set on the client, the "
            f"messages are the first argument, and a streamed reply is asked for with client.stream(...)",
            field=reserved[0],
        )
    if "stream_options" in params and not stream:
        raise InvalidSpecError("stream_options applies to a streamed reply: use client.stream(...)",
                               field="stream_options")
    if "tools" in params:
        check_tools(params["tools"])
    if "tool_choice" in params:
        check_tool_choice(params["tool_choice"])
    body: dict[str, Any] = {"model": model, "messages": [m.to_json() for m in coerce_messages(messages)], **params}
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True, **dict(params.get("stream_options") or {})}
    try:
        return json.dumps(body)
    except (TypeError, ValueError) as error:
        raise InvalidSpecError(f"chat parameters must be JSON-serialisable: {error}", field="params") from None


def check_tools(tools: object) -> None:
    """Raises ``InvalidSpecError`` unless ``tools`` is a list of function tools, each with a name."""
    if not isinstance(tools, (list, tuple)):
        raise InvalidSpecError(f"tools must be a list of {{'type': 'function', 'function': {{...}}}}, got "
                               f"{type(tools).__name__}", field="tools")
    names = []
    for index, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, Mapping) else None
        name = function.get("name") if isinstance(function, Mapping) else None
        if not isinstance(tool, Mapping) or tool.get("type") != "function" or not isinstance(name, str) or not name:
            raise InvalidSpecError(
                f"tools[{index}] must be {{'type': 'function', 'function': {{'name': ..., 'description': ..., "
                f"'parameters': <JSON Schema>}}}}, got {tool!r}", field="tools")
        names.append(name)
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise InvalidSpecError(f"tools names {', '.join(repeated)} more than once; a model calls tools by name",
                               field="tools")


def check_tool_choice(choice: object) -> None:
    """Raises ``InvalidSpecError`` unless ``choice`` is one of :data:`TOOL_CHOICES` or names a function."""
    if isinstance(choice, str) and choice in TOOL_CHOICES:
        return
    function = choice.get("function") if isinstance(choice, Mapping) else None
    if isinstance(function, Mapping) and isinstance(function.get("name"), str) and function["name"]:
        return
    raise InvalidSpecError(
        f"tool_choice must be one of {', '.join(TOOL_CHOICES)} or {{'type': 'function', 'function': "
        f"{{'name': ...}}}}, got {choice!r}", field="tool_choice")


# --------------------------------------------------------------------------- replies


def _token_count(usage: Mapping[str, Any], name: str, *, url: str) -> int:
    value = usage.get(name)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ModelResponseError(
            url=url, detail=f"chat response usage.{name} must be a non-negative integer, got {value!r}"
        )
    return value


def usage_of(usage_json: object, *, url: str) -> Usage:
    """Token usage as the server reported it; none reported counts as zero (a budget then sees nothing)."""
    if usage_json is None:
        return Usage()
    if not isinstance(usage_json, Mapping):
        raise ModelResponseError(url=url, detail=f"chat response usage must be an object, got {usage_json!r}")
    return Usage(prompt_tokens=_token_count(usage_json, "prompt_tokens", url=url),
                 completion_tokens=_token_count(usage_json, "completion_tokens", url=url))


def _tool_calls(calls_json: object, *, url: str) -> tuple[ToolCall, ...]:
    if calls_json is None:
        return ()
    if not isinstance(calls_json, list):
        raise ModelResponseError(url=url, detail=f"chat response tool_calls must be a list, got {calls_json!r}")
    calls = []
    for index, call in enumerate(calls_json):
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(call, Mapping) or not isinstance(function, Mapping):
            raise ModelResponseError(url=url, detail=f"chat response tool_calls[{index}] has no function: {call!r}")
        arguments: Any = function.get("arguments")
        name: Any = function.get("name")
        if isinstance(arguments, (dict, list)):
            arguments = json.dumps(arguments)  # some servers send the object itself, not its JSON text
        try:
            calls.append(ToolCall(id=call.get("id") or f"call_{index}", name=name,
                                  arguments="{}" if arguments is None else arguments))
        except InvalidSpecError as error:
            raise ModelResponseError(url=url, detail=f"chat response tool_calls[{index}] is malformed: "
                                     f"{error.message}; got {call!r}") from None
    return tuple(calls)


def parse_completion(body: str, *, url: str, default_model: str) -> ChatReply:
    """Decode a chat completions response body from ``url`` into a :class:`ChatReply`.

    Raises:
        ModelResponseError: naming the part of the response that is missing or malformed.
    """
    try:
        raw = json.loads(body)
    except ValueError:
        raise ModelResponseError(url=url, detail=f"chat response is not JSON: {excerpt(body)!r}") from None
    if not isinstance(raw, dict):
        raise ModelResponseError(url=url, detail=f"chat response must be a JSON object, got {excerpt(body)!r}")
    choices = raw.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ModelResponseError(url=url, detail=f"chat response has no choices[0]: {excerpt(body)!r}")
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise ModelResponseError(url=url, detail=f"chat response has no choices[0].message: {excerpt(body)!r}")
    calls = _tool_calls(message.get("tool_calls"), url=url)
    content = message.get("content")
    if content is None and calls:
        content = ""  # a tool-call turn legitimately carries no text
    if not isinstance(content, str):
        raise ModelResponseError(
            url=url, detail=f"chat response has no string choices[0].message.content: {excerpt(body)!r}"
        )
    finish_reason = choices[0].get("finish_reason")
    model = raw.get("model")
    return ChatReply(
        text=content,
        usage=usage_of(raw.get("usage"), url=url),
        model=model if isinstance(model, str) and model else default_model,
        finish_reason=finish_reason if isinstance(finish_reason, str) else None,
        raw=raw,
        tool_calls=calls,
    )


# --------------------------------------------------------------------------- streams


@dataclass(slots=True)
class _PartialCall:
    id: str | None = None
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass(slots=True)
class ReplyAssembler:
    """Turns a stream's events into deltas and, at its end, the whole reply.

    Feed it the ``data`` of each server-sent event in order (:meth:`add`); once it
    returns ``None`` for the ``[DONE]`` event, or the body ended after a finish reason,
    :meth:`reply` assembles what came. Tool calls are put together by their ``index``,
    their argument fragments concatenated; usage is the last chunk's that carried one.
    """

    url: str
    default_model: str
    text: list[str] = field(default_factory=list)
    calls: dict[int, _PartialCall] = field(default_factory=dict)
    usage: Usage = field(default_factory=Usage)
    model: str = ""
    finish_reason: str | None = None
    last: dict[str, Any] = field(default_factory=dict)
    done: bool = False
    chunks: int = 0

    def add(self, data: str) -> list[ChatDelta] | None:
        """The deltas one event carries; ``None`` for the event that ends the stream.

        Raises:
            ModelResponseError: the event is not a chunk of a chat completion, or the server
                sent an error in place of one.
        """
        if data.strip() == DONE:
            self.done = True
            return None
        try:
            chunk = json.loads(data)
        except ValueError:
            raise ModelResponseError(url=self.url, detail=f"a streamed chunk is not JSON: {excerpt(data)!r}") from None
        if not isinstance(chunk, dict):
            raise ModelResponseError(url=self.url, detail=f"a streamed chunk must be an object: {excerpt(data)!r}")
        if "error" in chunk:
            raise ModelResponseError(url=self.url, detail=f"the server ended the stream with an error after "
                                     f"{self.chunks} chunk(s): {excerpt(json.dumps(chunk['error']))}")
        self.chunks += 1
        self.last = chunk
        if chunk.get("usage") is not None:
            self.usage = usage_of(chunk["usage"], url=self.url)
        if isinstance(chunk.get("model"), str) and chunk["model"]:
            self.model = chunk["model"]
        choices = chunk.get("choices") or []
        if not isinstance(choices, list):
            raise ModelResponseError(url=self.url, detail=f"a streamed chunk's choices must be a list: "
                                     f"{excerpt(data)!r}")
        deltas: list[ChatDelta] = []
        for choice in choices:
            if not isinstance(choice, dict):
                raise ModelResponseError(url=self.url, detail=f"a streamed choice must be an object: {excerpt(data)!r}")
            if choice.get("index", 0) != 0:
                continue  # only the first choice is assembled, as ChatReply holds one
            deltas.extend(self._delta(choice.get("delta") or {}, data))
            if isinstance(choice.get("finish_reason"), str):
                self.finish_reason = choice["finish_reason"]
        return deltas

    def _delta(self, delta: object, data: str) -> list[ChatDelta]:
        if not isinstance(delta, dict):
            raise ModelResponseError(url=self.url, detail=f"a streamed delta must be an object: {excerpt(data)!r}")
        deltas = []
        content = delta.get("content")
        if content is not None:
            if not isinstance(content, str):
                raise ModelResponseError(url=self.url, detail=f"a streamed delta's content must be a string: "
                                         f"{excerpt(data)!r}")
            if content:
                self.text.append(content)
                deltas.append(ChatDelta(text=content))
        calls = delta.get("tool_calls") or []
        if not isinstance(calls, list):
            raise ModelResponseError(url=self.url, detail=f"a streamed delta's tool_calls must be a list: "
                                     f"{excerpt(data)!r}")
        for position, call in enumerate(calls):
            function = call.get("function") if isinstance(call, dict) else None
            index = call.get("index", position) if isinstance(call, dict) else None
            if not isinstance(index, int) or isinstance(index, bool) or not isinstance(function or {}, dict):
                raise ModelResponseError(url=self.url, detail=f"a streamed tool call delta is malformed: "
                                         f"{excerpt(json.dumps(call))!r}")
            function = function or {}
            partial = self.calls.setdefault(index, _PartialCall())
            call_id, name, arguments = call.get("id"), function.get("name"), function.get("arguments") or ""
            if isinstance(arguments, (dict, list)):
                arguments = json.dumps(arguments)
            if not all(isinstance(v, str) for v in (call_id or "", name or "", arguments)):
                raise ModelResponseError(url=self.url, detail=f"a streamed tool call delta is malformed: "
                                         f"{excerpt(json.dumps(call))!r}")
            if call_id:
                partial.id = call_id
            if name:
                partial.name += name
            if arguments:
                partial.arguments.append(arguments)
            deltas.append(ChatDelta(tool_index=index, tool_call_id=call_id or None, tool_name=name or None,
                                    arguments=arguments))
        return deltas

    @property
    def complete(self) -> bool:
        """The stream said it ended (``[DONE]``) or gave a finish reason: a body ending now lost nothing."""
        return self.done or self.finish_reason is not None

    def reply(self) -> ChatReply:
        """The reply the stream carried.

        Raises:
            ModelResponseError: a tool call never got its name.
        """
        calls = []
        for index in sorted(self.calls):
            partial = self.calls[index]
            if not partial.name:
                raise ModelResponseError(url=self.url, detail=f"streamed tool call {index} never got a name")
            calls.append(ToolCall(id=partial.id or f"call_{index}", name=partial.name,
                                  arguments="".join(partial.arguments) or "{}"))
        return ChatReply(text="".join(self.text), usage=self.usage, model=self.model or self.default_model,
                         finish_reason=self.finish_reason, raw=self.last, tool_calls=tuple(calls))


def sse_data(lines: Iterable[str]) -> list[str]:
    """The ``data`` of the complete events in ``lines`` (one event's lines, blank line excluded).

    Comments (``:``) and other fields (``event:``, ``id:``) are skipped; several ``data``
    lines of one event are joined with newlines, as the SSE specification says.
    """
    data = [line[5:].removeprefix(" ") for line in lines if line.startswith("data:")]
    return ["\n".join(data)] if data else []
