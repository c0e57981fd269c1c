"""``rf.ChatAgent`` on a real fleet, on both ledger stores, against ``rf.testing.ScriptedModelServer``.

The model loop with own tools (validated arguments, parallel calls run at once, errors
told to the model, one result per call id), the conversation kept in State, journaled
model calls that a retried turn does not repeat, the iteration limit, and the stream.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any, ClassVar

import pytest

import rayfleet as rf
from rayfleet.testing import ScriptedModelServer, ScriptedReply


def desk(url: str, **settings: Any) -> type[rf.ChatAgent]:
    """A support desk agent on the model at ``url`` (defined here: the URL is known only at run time)."""

    class Desk(rf.ChatAgent):
        model = rf.Model("scripted", base_url=url)
        instructions = "You answer order questions."
        max_iterations = settings.get("max_iterations", 8)

        class State(rf.ChatAgent.State):
            keys: list[str] = []

        arrived: ClassVar[set[str]] = set()
        attempts: ClassVar[dict[str, int]] = {}

        @rf.tool
        async def order_status(self, order_id: int) -> str:
            """Look up the status of an order.

            Args:
                order_id: the order's number, as the customer gave it.
            """
            self.state.keys = [*self.state.keys, self.tool_call_key]
            return f"order {order_id}: shipped"

        @rf.tool(idempotent=True)
        async def meet(self, side: str) -> str:
            """Wait (up to 20 s) for the other side's call: both arrive only if the two calls run at once."""
            Desk.arrived.add(side)
            for _ in range(200):
                if len(Desk.arrived) >= 2:
                    return "met"
                await asyncio.sleep(0.1)
            return "alone"

        @rf.handler
        async def tool_keys(self) -> list[str]:
            return self.state.keys

        @rf.tool(idempotent=True)
        async def pause(self, seconds: float) -> str:
            """Wait a while."""
            await asyncio.sleep(seconds)
            return "paused"

        @rf.tool
        def explode(self) -> str:
            """Fail."""
            raise ValueError("boom")

        @rf.tool(approval=True)
        async def refund(self, order_id: int, eur: int) -> str:
            """Refund an order (a person approves each refund)."""
            self.state.keys = [*self.state.keys, self.tool_call_key]
            return f"refunded {eur} EUR for order {order_id}"

        @rf.tool(idempotent=True)
        def flaky(self) -> dict[str, int]:
            """Fail with a retryable error on the first attempt of each call, then answer."""
            count = Desk.attempts[self.tool_call_key] = Desk.attempts.get(self.tool_call_key, 0) + 1
            if count == 1:
                raise rf.RetryableError("not yet")
            return {"attempts": count}

    return Desk


def tool_messages(request: dict[str, Any]) -> dict[str, str]:
    return {m["tool_call_id"]: m["content"] for m in request["messages"] if m["role"] == "tool"}


def test_the_loop_runs_tools_at_once_tells_the_model_every_outcome_and_keeps_the_conversation(
        make_any_fleet: Any) -> None:
    calls = [rf.ToolCall("c1", "order_status", '{"order_id": 42}'), rf.ToolCall("c2", "meet", '{"side": "a"}'),
             rf.ToolCall("c3", "meet", '{"side": "b"}'), rf.ToolCall("c4", "cancel_order", "{}"),
             rf.ToolCall("c5", "order_status", '{"order_id": "forty-two"}'), rf.ToolCall("c6", "explode", "{}"),
             rf.ToolCall("c7", "order_status", '{"order_id": ')]
    script = [ScriptedReply(tool_calls=calls), "Order 42 has shipped.", "You asked about order 42."]
    with ScriptedModelServer(script) as server:
        fleet = make_any_fleet(hosts=1)
        ref = fleet.spawn("desk/anna", desk(server.url))
        assert ref.call("chat", message="Where is order 42?") == "Order 42 has shipped."
        assert ref.call("chat", message="What did I ask?") == "You asked about order 42."
        keys = ref.call("tool_keys")
        first, second, third = server.requests

    assert first["messages"] == [{"role": "system", "content": "You answer order questions."},
                                 {"role": "user", "content": "Where is order 42?"}]
    assert first["tool_choice"] == "auto" and first["stream"] is True
    order_status = next(t["function"] for t in first["tools"] if t["function"]["name"] == "order_status")
    assert order_status["description"] == "Look up the status of an order."
    assert order_status["parameters"]["properties"]["order_id"]["type"] == "integer"
    assert order_status["parameters"]["properties"]["order_id"]["description"] == \
        "the order's number, as the customer gave it."
    assert order_status["parameters"]["required"] == ["order_id"]

    results = tool_messages(second)
    assert list(results) == ["c1", "c2", "c3", "c4", "c5", "c6", "c7"], "one result per call id, in the model's order"
    assert results["c1"] == "order 42: shipped"
    assert results["c2"] == results["c3"] == "met", "the two calls ran at once"
    assert results["c4"].startswith("error: there is no tool named 'cancel_order'")
    assert results["c5"].startswith("error: invalid arguments for tool order_status: order_id:")
    assert results["c6"] == "error: ValueError: boom"
    assert results["c7"].startswith("error: the arguments of tool call c7 (order_status) are not JSON")
    assistant = second["messages"][2]
    assert assistant["role"] == "assistant" and [c["id"] for c in assistant["tool_calls"]] == [c.id for c in calls]

    # The second turn starts from the kept conversation: both turns' messages, no second system message.
    roles = [m["role"] for m in third["messages"]]
    assert roles == ["system", "user", "assistant", *["tool"] * 7, "assistant", "user"]
    assert third["messages"][-2] == {"role": "assistant", "content": "Order 42 has shipped."}
    [key] = keys
    assert key.startswith("desk/anna:") and key.endswith(":c1"), "identity:turn:tool_call_id"


def test_a_retried_turn_does_not_call_the_model_again_for_a_journaled_reply_and_the_limit_ends_the_loop(
        make_any_fleet: Any) -> None:
    def model(body: dict[str, Any]) -> str | ScriptedReply:
        asked = body["messages"][-1]
        if body.get("tool_choice") == "none":
            return "I stop here."
        if asked["role"] == "user" and asked["content"] == "be flaky":
            return ScriptedReply(tool_calls=[rf.ToolCall("f1", "flaky", "{}")])
        if asked["role"] == "tool" and asked["tool_call_id"] == "f1":
            return f"flaky said {asked['content']}"
        return ScriptedReply(tool_calls=[rf.ToolCall(f"o{len(body['messages'])}", "order_status",
                                                     '{"order_id": 1}')])

    with ScriptedModelServer(model) as server:
        fleet = make_any_fleet(hosts=1)
        flaky = fleet.spawn("desk/flaky", desk(server.url))
        assert flaky.call("chat", message="be flaky") == 'flaky said {"attempts": 2}'
        # The tool's retryable failure retried the turn; its first model call came from the journal.
        assert server.served == 2

        limited = fleet.spawn("desk/limited", desk(server.url, max_iterations=3))
        assert limited.call("chat", message="loop forever") == "I stop here."
        asked = server.requests[2:]
    assert [request.get("tool_choice") for request in asked] == ["auto", "auto", "none"]
    assert all(m["role"] != "tool" or m["content"] == "order 1: shipped" for m in asked[-1]["messages"])


def test_the_turn_streams_the_model_text_and_each_tool_call_and_its_result(make_any_fleet: Any) -> None:
    script = [ScriptedReply(text="Let me check.", tool_calls=[rf.ToolCall("s1", "order_status", '{"order_id": 7}')]),
              "Order 7 has shipped today."]
    with ScriptedModelServer(script, chunk_delay=0.01) as server:
        fleet = make_any_fleet(hosts=1)
        ref = fleet.spawn("desk/streamed", desk(server.url))
        handle = ref.start("chat", message="Order 7?")
        events = list(handle.events())
        assert handle.result(timeout=60) == "Order 7 has shipped today."
    text = "".join(event.data for event in events if event.kind == "delta")
    assert text == "Let me check.Order 7 has shipped today."
    tool_events = [(event.kind, event.data) for event in events if event.kind in ("tool_call", "tool_result")]
    assert tool_events == [("tool_call", {"id": "s1", "name": "order_status", "arguments": '{"order_id": 7}'}),
                           ("tool_result", {"id": "s1", "name": "order_status", "result": "order 7: shipped"})]
    assert events[-1].kind == "completed" and json.dumps(events[-1].data)


def pending_approval(fleet: rf.Fleet, identity: str) -> rf.ApprovalInfo:
    for _ in range(600):
        pending = fleet.approvals.list(identity=identity)
        if pending:
            return pending[0]
        time.sleep(0.1)
    raise AssertionError(f"no approval of {identity} came")


def test_a_tool_that_needs_approval_suspends_the_turn_until_a_person_decides_and_a_rejection_is_its_result(
        make_any_fleet: Any) -> None:
    calls = [rf.ToolCall("r1", "refund", '{"order_id": 1, "eur": 5}'),
             rf.ToolCall("r2", "refund", '{"order_id": 2, "eur": 900}'),
             rf.ToolCall("r3", "order_status", '{"order_id": 3}')]
    with ScriptedModelServer([ScriptedReply(tool_calls=calls), "One refund done, one refused."]) as server:
        fleet = make_any_fleet(hosts=1)
        ref = fleet.spawn("desk/refunds", desk(server.url))
        handle = ref.start("chat", message="Refund orders 1 and 2, and check 3.")
        first = pending_approval(fleet, "desk/refunds")
        assert first.subject == "call refund" and first.data == {"tool": "refund", "arguments": {"order_id": 1, "eur": 5},
                                                                 "call_id": "r1"}
        fleet.approvals.resolve(first.id, approved=True, by="manager")
        second = pending_approval(fleet, "desk/refunds")
        assert second.data["call_id"] == "r2"
        fleet.approvals.resolve(second.id, approved=False, by="manager", comment="over the limit")
        assert handle.result(timeout=60) == "One refund done, one refused."
        keys = ref.call("tool_keys")
        assert server.served == 2, "the suspended turn's model call came from the journal when it resumed"
        results = tool_messages(server.requests[1])
    assert results == {"r1": "refunded 5 EUR for order 1",
                       "r2": "error: the call was rejected by manager: over the limit; it did not run",
                       "r3": "order 3: shipped"}
    assert [key.rsplit(":", 1)[1] for key in keys] == ["r1", "r3"], "the rejected refund never ran"


class Billing(rf.Agent):
    class State(rf.State):
        refunded: int = 0

    @rf.handler
    async def refund(self, order_id: int, eur: int, reason: str = "") -> str:
        """Refund an order in full or in part."""
        if eur > 100:
            raise ValueError(f"{eur} EUR is over the desk's limit")
        self.state.refunded += eur
        return f"refund {order_id}: {eur} EUR (total {self.state.refunded})"


def test_a_peer_tool_calls_another_agents_handler_described_by_its_own_signature(make_any_fleet: Any) -> None:
    calls = [rf.ToolCall("p1", "refund", '{"order_id": 1, "eur": 20}'),
             rf.ToolCall("p2", "refund", '{"order_id": 2, "eur": 500}'),
             rf.ToolCall("p3", "refund", '{"order_id": "two"}')]
    with ScriptedModelServer([ScriptedReply(tool_calls=calls), "Refunded order 1."]) as server:
        class Front(rf.ChatAgent):
            model = rf.Model("scripted", base_url=server.url)
            tools = [rf.peer_tool("billing/eu", Billing.refund)]

        class Lost(rf.ChatAgent):
            model = rf.Model("scripted", base_url=server.url)
            tools = [rf.peer_tool("billing/nowhere", "refund")]

        class Wrong(rf.ChatAgent):
            model = rf.Model("scripted", base_url=server.url)
            tools = [rf.peer_tool("billing/eu", "refnud")]

        fleet = make_any_fleet(hosts=1)
        fleet.spawn("billing/eu", Billing)
        assert fleet.spawn("front/1", Front).call("chat", message="refund please") == "Refunded order 1."
        request, follow_up = server.requests
        with pytest.raises(rf.HandlerError, match="unknown identity 'billing/nowhere'"):
            fleet.spawn("front/lost", Lost).call("chat", message="refund please")
        with pytest.raises(rf.HandlerError, match="has no handler 'refnud'"):
            fleet.spawn("front/wrong", Wrong).call("chat", message="refund please")
        assert server.served == 2, "a turn whose tools cannot be described calls no model"

    [described] = [t["function"] for t in request["tools"]]
    assert described["name"] == "refund" and described["description"] == "Refund an order in full or in part."
    assert set(described["parameters"]["properties"]) == {"order_id", "eur", "reason"}
    assert described["parameters"]["required"] == ["order_id", "eur"]
    results = tool_messages(follow_up)
    assert results["p1"] == "refund 1: 20 EUR (total 20)"
    assert results["p2"].startswith("error: HandlerError") and "over the desk's limit" in results["p2"]
    assert results["p3"].startswith("error: invalid arguments for tool refund: ")


def test_a_handoff_continues_the_conversation_at_the_peer_whose_answer_ends_the_turn(make_any_fleet: Any) -> None:
    def model(body: dict[str, Any]) -> str | ScriptedReply:
        last = body["messages"][-1]
        if last["role"] == "system" and "handed this conversation over to you" in last["content"]:
            return "Escalations here: your refund is approved."
        if last["role"] == "user" and last["content"] == "I want a manager":
            return ScriptedReply(tool_calls=[
                rf.ToolCall("h1", "transfer_to_support_escalations", '{"note": "customer is upset"}'),
                rf.ToolCall("h2", "transfer_to_support_escalations", "{}")])
        if last["role"] == "user" and last["content"] == "ask nobody":
            return ScriptedReply(tool_calls=[rf.ToolCall("h3", "to_nobody", "{}")])
        if last["role"] == "tool":
            return "I will handle it myself."
        return "Hello from the front desk."

    with ScriptedModelServer(model) as server:
        class Escalations(rf.ChatAgent):
            model = rf.Model("scripted", base_url=server.url)
            instructions = "You are the escalation desk."

        class Front(rf.ChatAgent):
            model = rf.Model("scripted", base_url=server.url)
            instructions = "You are the front desk."
            tools = [rf.handoff("support/escalations"), rf.handoff("support/nobody", name="to_nobody")]

        fleet = make_any_fleet(hosts=1)
        fleet.spawn("support/escalations", Escalations)
        front = fleet.spawn("support/front", Front)
        assert front.call("chat", message="hi") == "Hello from the front desk."
        assert front.call("chat", message="I want a manager") == "Escalations here: your refund is approved."
        assert server.served == 3, "the front desk made no model call after the handoff"
        assert front.call("chat", message="ask nobody") == "I will handle it myself."
        taken = server.requests[2]
        refused = tool_messages(server.requests[4])

    assert [m["role"] for m in taken["messages"]] == ["system", "user", "assistant", "user", "system"]
    assert taken["messages"][0]["content"] == "You are the escalation desk."
    assert taken["messages"][1:4] == [{"role": "user", "content": "hi"},
                                      {"role": "assistant", "content": "Hello from the front desk."},
                                      {"role": "user", "content": "I want a manager"}]
    assert taken["messages"][4]["content"].startswith(
        "support/front handed this conversation over to you: customer is upset")
    history = server.requests[3]["messages"]  # the front desk's next turn sees how the last one ended
    handed = {m["tool_call_id"]: m["content"] for m in history if m["role"] == "tool"}
    assert handed == {"h1": "the conversation was handed over to support/escalations, who answered the user",
                      "h2": "error: one handoff per reply; the conversation goes to support/escalations"}
    assert history[-2] == {"role": "assistant", "content": "Escalations here: your refund is approved."}
    assert refused["h3"].startswith("error: ") and "support/nobody" in refused["h3"]


def test_a_steer_message_joins_the_conversation_before_the_next_model_call(make_any_fleet: Any) -> None:
    script = [ScriptedReply(tool_calls=[rf.ToolCall("w1", "pause", '{"seconds": 5}')]), "En route, en français."]
    with ScriptedModelServer(script) as server:
        fleet = make_any_fleet(hosts=1)
        ref = fleet.spawn("desk/steered", desk(server.url))
        handle = ref.start("chat", message="Where is order 9?")
        steered: list[Any] = []
        for event in handle.events():
            if event.kind == "tool_call":  # the tool pauses for 5 s: time to steer
                steering = threading.Thread(target=lambda: steered.append(
                    ref.call("chat", message="answer in French", mode="steer")))
                steering.start()
        steering.join(timeout=60)
        assert handle.result(timeout=60) == "En route, en français."
        assert steered == ["En route, en français."], "the steer message's caller gets the turn's answer"
        follow_up = server.requests[1]["messages"]
    assert follow_up[-2:] == [{"role": "tool", "content": "paused", "tool_call_id": "w1"},
                              {"role": "user", "content": "answer in French"}]


def test_a_model_server_that_fails_ends_the_turn_with_the_model_error_and_keeps_the_conversation_as_it_was(
        make_any_fleet: Any) -> None:
    script = [ScriptedReply(status=500), ScriptedReply(status=500), ScriptedReply(status=500),
              ScriptedReply(body="<html>gateway</html>"), "Back again."]
    with ScriptedModelServer(script) as server:
        class Fragile(rf.ChatAgent):
            model = rf.Model("scripted", base_url=server.url, max_retries=2)

        fleet = make_any_fleet(hosts=1)
        ref = fleet.spawn("desk/fragile", Fragile)
        with pytest.raises(rf.HandlerError, match="ModelUnavailableError") as down:
            ref.call("chat", message="first")
        assert server.served == 3, "the client's own retries, then the turn failed: not retried again"
        with pytest.raises(rf.HandlerError, match="ModelResponseError"):
            ref.call("chat", message="second")
        assert ref.call("chat", message="third") == "Back again."
        kept = server.requests[-1]["messages"]
    assert "HTTP 500" in str(down.value)
    assert kept == [{"role": "user", "content": "third"}], "a failed turn adds nothing to the conversation"
