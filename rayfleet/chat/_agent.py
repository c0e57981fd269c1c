"""``rf.ChatAgent``: an agent whose ``chat`` handler runs a model loop on a durable turn.

The loop: a model call, then the tool calls it asked for (independent ones at once), then
a model call again, until the model answers without tools or ``max_iterations`` model
calls were made. Each model call is a step (its text streams live as deltas, its reply is
journaled) and each tool call a step named by its call id; so a turn that runs again
after its host died calls the model only past the last journaled reply and repeats no
completed tool call.

The transcript stays valid for any provider: every assistant message with tool calls is
followed by exactly one ``tool`` message per call id, whatever became of the call (an
unknown tool, arguments that do not validate, a tool that raised, an outcome unknown after
a failover): each is told to the model as the call's result, and the loop goes on.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import json
from collections.abc import Coroutine, Sequence
from typing import Any, ClassVar

import pydantic

from ..errors import InvalidSpecError, LeaseLostError, StepOutcomeUnknownError, TurnError, UsageError, is_retryable
from ..identity._agent import Agent
from ..identity._handlers import Reply, State, Usage, handler
from ..llm._chat import ChatClient
from ..llm._values import ChatMessage, ChatReply, ToolCall, coerce_messages
from ..turns._current import current_turn
from ._model import Model
from ._peers import Handoff, PeerTool
from ._tools import ToolSpec, tools_of

RESULT_EVENT_CHARS = 4096
"""Characters of a tool call's arguments and result its stream events carry (the transcript keeps them whole)."""
_TOOL_CALL_KEY: contextvars.ContextVar[str] = contextvars.ContextVar("rayfleet_tool_call_key")


class ChatState(State):
    """What a ``ChatAgent`` keeps between turns: its conversation, one JSON message per entry.

    The system message is not kept: it is the class's ``instructions`` at each turn.
    Subclass it (``class State(rf.ChatAgent.State)``) to keep more.
    """

    messages: list[str] = pydantic.Field(default_factory=list)


class ChatAgent(Agent):
    """An agent that answers ``chat(message)`` by running a model loop with tools, durably.

    Set on the subclass:

    - ``model``: an ``rf.Model`` (required);
    - ``instructions``: the system message (optional);
    - ``max_iterations``: model calls per turn at most (8); the last one is asked to
      answer without tools (``tool_choice="none"``), so a turn always ends with an answer;
    - ``stream``: whether model replies stream live as deltas (``True``);
    - ``remember``: whether the conversation is kept between turns (``True``); ``False``
      makes each ``chat`` a conversation of its own (a researcher answering independent
      questions), with nothing added to State;
    - methods marked ``@rf.tool``: the tools the model may call.

    A message sent with ``mode="steer"`` while a turn runs (``ref.call("chat",
    message="answer in French", mode="steer")``) joins the conversation as a user
    message before the turn's next model call; its caller gets the turn's answer.

    ``chat`` returns the answer's text with the turn's token usage (``rf.Reply``), which
    workflow budgets count. The conversation is kept in State (``self.state.messages``,
    ``self.transcript()``). The turn's stream carries the model's text as deltas and a
    persisted ``tool_call`` / ``tool_result`` event per tool call.

    Raises (when the class is defined):
        InvalidSpecError: no ``model``, a ``State`` that is not a ``ChatAgent.State``, a
            bad ``max_iterations``, or a tool that cannot be described.
    """

    State: ClassVar[type[State]] = ChatState
    model: ClassVar[Model | None] = None
    tools: ClassVar[Sequence[PeerTool | Handoff]] = ()
    instructions: ClassVar[str] = ""
    max_iterations: ClassVar[int] = 8
    stream: ClassVar[bool] = True
    remember: ClassVar[bool] = True
    __rayfleet_tools__: ClassVar[dict[str, ToolSpec]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.__rayfleet_tools__ = tools_of(cls)
        # A class shipped by value is rebuilt from an empty body first, its attributes set
        # after: checked when an instance is made instead (as every class is, on its host).
        if set(cls.__dict__) - {"__doc__", "__module__", "__qualname__", "__rayfleet_tools__",
                                "__rayfleet_handlers__"}:
            cls._check_definition()

    @classmethod
    def _check_definition(cls) -> None:
        where = cls.__qualname__
        if not isinstance(cls.model, Model):
            raise InvalidSpecError(f"{where}.model must be an rf.Model(...), got {cls.model!r}", field="model")
        if not (isinstance(cls.State, type) and issubclass(cls.State, ChatState)):
            raise InvalidSpecError(f"{where}.State must subclass rf.ChatAgent.State (it keeps the conversation)",
                                   field="agent")
        if not isinstance(cls.instructions, str):
            raise InvalidSpecError(f"{where}.instructions must be a string", field="instructions")
        if isinstance(cls.max_iterations, bool) or not isinstance(cls.max_iterations, int) or cls.max_iterations < 1:
            raise InvalidSpecError(f"{where}.max_iterations must be an integer >= 1, got {cls.max_iterations!r}",
                                   field="max_iterations")
        if isinstance(cls.tools, (str, bytes)) or not all(isinstance(t, (PeerTool, Handoff)) for t in cls.tools):
            raise InvalidSpecError(f"{where}.tools must be a list of rf.peer_tool(...) and rf.handoff(...), got "
                                   f"{cls.tools!r} (an agent's own methods are tools with @rf.tool)", field="tools")
        names = [*cls.__rayfleet_tools__, *(t.tool_name for t in cls.tools)]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise InvalidSpecError(f"{where} offers more than one tool named {', '.join(repeated)}; give a peer "
                                   f"tool another with rf.peer_tool(..., name=...)", field="tools")

    def __init__(self) -> None:
        type(self)._check_definition()
        super().__init__()
        self._client: ChatClient | None = None
        self._peer_tools: dict[str, ToolSpec] | None = None

    # -- what a subclass and its tools can read

    def transcript(self) -> list[ChatMessage]:
        """The conversation kept so far (without the system message), oldest first."""
        return coerce_messages([json.loads(text) for text in self.state.messages]) if self.state.messages else []

    @property
    def tool_call_key(self) -> str:
        """``identity:turn:tool_call_id`` of the tool call running now; only inside a tool.

        Stable across the turn's replays and failovers: the key to make a tool's outside
        effect idempotent (a payment's idempotency key, a row's id).

        Raises:
            UsageError: outside a tool call.
        """
        key = _TOOL_CALL_KEY.get(None)
        if key is None:
            raise UsageError("self.tool_call_key is known only inside an @rf.tool method while the model's call of "
                             "it runs", api="ChatAgent.tool_call_key")
        return key

    # -- the loop

    @handler
    async def chat(self, message: str) -> Reply:
        """Answer ``message``, calling tools as the model asks; returns the answer and the turn's usage."""
        answer, usage = await self._converse([ChatMessage("user", message)])
        return Reply(answer, usage=usage)

    @handler
    async def take_over(self, conversation: list[dict[str, Any]], note: str = "", by: str = "") -> dict[str, Any]:
        """Go on with a conversation another agent handed over (``rf.handoff``); returns the answer and usage.

        The conversation's user and assistant texts join this agent's own, with a
        system message saying who handed it over and their ``note``; this agent's
        model answers the last user message, with this agent's tools.
        """
        handed = [m for m in coerce_messages(conversation) if m.role in ("user", "assistant") and not m.tool_calls
                  and m.content] if conversation else []
        told = f"{by or 'another agent'} handed this conversation over to you" + (f": {note}" if note else "")
        answer, usage = await self._converse([*handed, ChatMessage("system", f"{told}. Answer the user's last "
                                                                             f"message.")])
        return {"answer": answer, "prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens}

    async def _converse(self, added: list[ChatMessage]) -> tuple[str, Usage]:
        """The loop over the kept conversation and ``added``; the answer and the tokens the turn's model calls took.

        ``added`` grows with the turn's messages, which join the kept conversation at the end.
        """
        cls = type(self)
        kept = self.transcript() if cls.remember else []
        system = [ChatMessage("system", cls.instructions)] if cls.instructions else []
        specs = {**cls.__rayfleet_tools__, **await self._resolved_peer_tools()}
        tools = [spec.definition() for spec in specs.values()]
        usage = Usage()
        answer = ""
        for iteration in range(cls.max_iterations):
            last = iteration == cls.max_iterations - 1
            # Steer messages sent since the last model call join the conversation before the next one.
            added.extend(ChatMessage("user", steer if isinstance(steer, str) else json.dumps(steer, default=str))
                         for steer in self.steering())
            params: dict[str, Any] = {}
            if tools:
                params = {"tools": tools, "tool_choice": "none" if last else "auto"}
            reply: ChatReply = await self.step(f"model:{iteration}", self._complete,
                                               [m.to_json() for m in (*system, *kept, *added)], params)
            usage = _plus(usage, reply.usage)
            added.append(reply.message)
            answer = reply.text
            if not reply.tool_calls:
                break
            handoffs = [call for call in reply.tool_calls if (spec := specs.get(call.name)) and spec.handoff]
            chosen = handoffs[0] if handoffs and not last else None
            refusals = {call.id: f"error: one handoff per reply; the conversation goes to {specs[chosen.name].peer}"
                        for call in handoffs if chosen is not None and call is not chosen}
            others = [call for call in reply.tool_calls if call is not chosen]
            # Approvals first, one after another, so no tool is mid-call while the turn is suspended.
            refusals |= {} if last else await self._approvals(specs, others)
            results = dict(zip((call.id for call in others), await _together(
                [self._tool_result(specs, call, refused=last, rejected=refusals.get(call.id)) for call in others]),
                strict=True))
            taken_over = None
            if chosen is not None:
                results[chosen.id], taken_over = await self._hand_over(specs[chosen.name], chosen, [*kept, *added])
            added.extend(ChatMessage.tool_result(call, results[call.id]) for call in reply.tool_calls)
            if taken_over is not None:
                answer = str(taken_over.get("answer", ""))
                usage = _plus(usage, Usage(prompt_tokens=int(taken_over.get("prompt_tokens", 0)),
                                           completion_tokens=int(taken_over.get("completion_tokens", 0))))
                added.append(ChatMessage("assistant", answer))
                break
        if cls.remember:
            self.state.messages = [*self.state.messages, *(json.dumps(m.to_json()) for m in added)]
        return answer, usage

    async def _complete(self, messages: list[dict[str, Any]], params: dict[str, Any]) -> ChatReply:
        """One model call (a step's function): streamed as deltas when ``stream`` is set."""
        client = self._chat_client()
        if not type(self).stream:
            return await client.chat(messages, **params)
        async with client.stream(messages, **params) as reply:
            async for delta in reply:
                if delta.text:
                    self.emit_delta(delta.text)
        return reply.reply

    def _chat_client(self) -> ChatClient:
        if self._client is None:
            model = type(self).model
            assert model is not None  # checked when the class was defined
            self._client = model.client()
        return self._client

    async def _hand_over(self, spec: ToolSpec, call: ToolCall,
                         conversation: list[ChatMessage]) -> tuple[str, dict[str, Any] | None]:
        """Hand the conversation to ``spec.peer`` (a step); the call's result, and the peer's answer if it took it."""
        _tool_event("tool_call", call, arguments=call.arguments[:RESULT_EVENT_CHARS])
        try:
            arguments = spec.validated(call.parsed_arguments())
            taken = await self.step(f"tool:{call.id}", self._invoke, spec, call.id, {
                "conversation": [m.to_json() for m in conversation], "by": self.identity, **arguments})
        except (LeaseLostError, TurnError):
            raise
        except Exception as error:  # as for any tool: what went wrong is the model's to read
            if is_retryable(error):
                raise
            result = f"error: {error}" if isinstance(error, ValueError) else f"error: {type(error).__name__}: {error}"
            taken = None
        else:
            result = f"the conversation was handed over to {spec.peer}, who answered the user"
        _tool_event("tool_result", call, result=result[:RESULT_EVENT_CHARS])
        return result, taken

    async def _resolved_peer_tools(self) -> dict[str, ToolSpec]:
        """The class's peer tools, described from their peers' handlers (read once per activation).

        Raises:
            InvalidSpecError: a peer has no such handler.
            UnknownIdentityError: a peer does not exist.
        """
        if self._peer_tools is None:
            context = self._context("tools")
            specs = {}
            for peer in type(self).tools:
                if isinstance(peer, Handoff):
                    specs[peer.tool_name] = peer.spec()  # checked when called: the model is told if it fails
                else:
                    specs[peer.tool_name] = peer.spec(await context.peer_handler(peer.target, peer.method))
            self._peer_tools = specs
        return self._peer_tools

    async def _approvals(self, specs: dict[str, ToolSpec], calls: Sequence[ToolCall]) -> dict[str, str]:
        """Ask for the approval of each call of an ``approval=True`` tool; the results of the rejected ones, by call id.

        Calls whose tool is unknown or whose arguments do not validate are not put to
        anyone: they fail as any call does.
        """
        rejected: dict[str, str] = {}
        for call in calls:
            spec = specs.get(call.name)
            if spec is None or not spec.approval:
                continue
            try:
                arguments = spec.validated(call.parsed_arguments())
            except ValueError:
                continue
            decision = await self.approval(f"call {call.name}", data={"tool": call.name, "arguments": arguments,
                                                                      "call_id": call.id})
            if not decision.approved:
                reason = f": {decision.comment}" if decision.comment else ""
                rejected[call.id] = f"error: the call was rejected by {decision.by}{reason}; it did not run"
        return rejected

    async def _tool_result(self, specs: dict[str, ToolSpec], call: ToolCall, *, refused: bool,
                           rejected: str | None) -> str:
        """What the model is told of ``call``: its result, or what went wrong (a step when the tool runs)."""
        spec = specs.get(call.name)
        _tool_event("tool_call", call, arguments=call.arguments[:RESULT_EVENT_CHARS])
        if refused:
            result = "error: the turn's model calls are used up; answer without tools"
        elif rejected is not None:
            result = rejected
        elif spec is None:
            known = ", ".join(sorted(specs)) or "none"
            result = f"error: there is no tool named {call.name!r}; the tools are: {known}"
        else:
            try:
                arguments = spec.validated(call.parsed_arguments())
            except ValueError as error:
                result = f"error: {error}"
            else:
                result = await self._run_tool(spec, call, arguments)
        _tool_event("tool_result", call, result=result[:RESULT_EVENT_CHARS])
        return result

    async def _run_tool(self, spec: ToolSpec, call: ToolCall, arguments: dict[str, Any]) -> str:
        # The step is taken before this coroutine's first await, so concurrent calls take
        # their journal positions in the order the model listed them, on every replay.
        try:
            value = await self.step(f"tool:{call.id}", self._invoke, spec, call.id, arguments,
                                    policy="retry" if spec.idempotent else "unknown")
        except StepOutcomeUnknownError:
            return (f"error: the outcome of this call is unknown (it was started, then its host stopped before it "
                    f"was recorded); it may or may not have taken effect: check before calling {call.name} again")
        except (LeaseLostError, TurnError):
            raise  # the turn's own fate (lost ownership, an interrupt, a journal that disagrees), not the tool's
        except Exception as error:  # a tool's failure is the model's to read, journaled as the step's outcome
            if is_retryable(error):
                raise  # not journaled: the turn is retried by the agent's retry policy, and the tool with it
            return f"error: {type(error).__name__}: {error}"
        return _as_text(value)

    async def _invoke(self, spec: ToolSpec, call_id: str, arguments: dict[str, Any]) -> Any:
        """A tool's step: its method with the validated arguments, its call key set; a peer's, keyed by it."""
        key = f"{self.step_key.rsplit(':', 1)[0]}:{call_id}"
        if spec.peer is not None:
            return await self._context("tools").send_keyed(spec.peer, spec.method, key, arguments)
        marker = _TOOL_CALL_KEY.set(key)
        try:
            value = getattr(self, spec.method)(**arguments)
            if inspect.isawaitable(value):
                value = await value
            return value
        finally:
            _TOOL_CALL_KEY.reset(marker)


def _tool_event(kind: str, call: ToolCall, **data: str) -> None:
    """A ``tool_call`` / ``tool_result`` event on the turn's stream, when it has one (nothing is written otherwise)."""
    current_turn("chat").watched_event(kind, {"id": call.id, "name": call.name, **data})


def _plus(one: Usage, other: Usage) -> Usage:
    return Usage(prompt_tokens=one.prompt_tokens + other.prompt_tokens,
                 completion_tokens=one.completion_tokens + other.completion_tokens)


async def _together(calls: list[Coroutine[Any, Any, str]]) -> list[str]:
    """Run ``calls`` at once, their results in order; the first to fail cancels the others and is raised.

    Unlike ``asyncio.gather``, no call goes on running after the turn stopped (its lease
    lost, an interrupt): a tool left running would act for a turn that is over.
    """
    tasks = [asyncio.ensure_future(call) for call in calls]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def _as_text(value: Any) -> str:
    """A tool's value as the ``tool`` message's content: text as it is, anything else as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, pydantic.BaseModel):
        return value.model_dump_json()
    try:
        return json.dumps(value, default=str)
    except (TypeError, ValueError):
        return str(value)

