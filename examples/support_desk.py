"""A support desk of model agents: its own tool, a peer's refund behind a manager's approval, a handoff.

Run: python examples/support_desk.py
(on a local Ray it starts, or the cluster at RAY_ADDRESS; the fleet's storage is
RAYFLEET_STORAGE, else ./.rayfleet). Offline: the model is
``rayfleet.testing.ScriptedModelServer``, a real OpenAI-compatible server on 127.0.0.1
answering from the function ``model`` below. Point ``rf.Model(base_url=...)`` at vLLM,
Ray Serve LLM or LiteLLM's proxy instead, and nothing else changes.

support/front answers three customer messages, streaming each answer: it looks an order
up with its own tool, refunds through billing/eu's handler once a manager approved it,
and hands the third over to support/escalations, whose answer ends the turn. Exits 0
when every check held.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from _checks import conclude

import rayfleet as rf
from rayfleet.testing import ScriptedModelServer, ScriptedReply


def model(body: dict[str, Any]) -> str | ScriptedReply:
    """The scripted model: what a real one would answer to the conversation's last message."""
    last = body["messages"][-1]
    if last["role"] == "system" and "handed this conversation over" in last["content"]:
        return "This is the escalation desk: a manager will call you today about order 42."
    if last["role"] == "tool":
        return {"o42": "Order 42 left the warehouse this morning and arrives on Thursday.",
                "r42": "Done: 30 EUR are refunded on order 42."}.get(last["tool_call_id"], "Sorry, that failed.")
    asked = last["content"]
    if "where" in asked.lower():
        return ScriptedReply(tool_calls=[rf.ToolCall("o42", "order_status", '{"order_id": 42}')])
    if "refund" in asked.lower():
        return ScriptedReply(tool_calls=[rf.ToolCall("r42", "refund", '{"order_id": 42, "eur": 30}')])
    return ScriptedReply(tool_calls=[rf.ToolCall("h42", "transfer_to_support_escalations",
                                                 '{"note": "wants a manager about order 42"}')])


class Billing(rf.Agent):
    """Refunds orders; knows what it refunded."""

    class State(rf.State):
        refunds: dict[str, int] = {}

    @rf.handler
    async def refund(self, order_id: int, eur: int) -> str:
        """Refund part of an order, in euros."""
        self.state.refunds = {**self.state.refunds, str(order_id): self.state.refunds.get(str(order_id), 0) + eur}
        return f"refunded {eur} EUR on order {order_id}"

    @rf.handler
    async def refunded(self) -> dict[str, int]:
        return dict(self.state.refunds)


def desks(model_url: str) -> tuple[type[rf.ChatAgent], type[rf.ChatAgent]]:
    """The front desk and the escalation desk on the model at ``model_url``."""

    class Front(rf.ChatAgent):
        model = rf.Model("support-model", base_url=model_url)
        instructions = "You are the front desk of an online shop. Be brief."
        tools = [rf.peer_tool("billing/eu", Billing.refund, approval=True),  # a manager approves each refund
                 rf.handoff("support/escalations")]

        @rf.tool
        async def order_status(self, order_id: int) -> str:
            """Look up where an order is.

            Args:
                order_id: the order's number, as the customer gave it.
            """
            return f"order {order_id}: shipped this morning, arriving Thursday"

    class Escalations(rf.ChatAgent):
        model = rf.Model("support-model", base_url=model_url)
        instructions = "You are the escalation desk. Promise a manager's call."

    return Front, Escalations


def manager(fleet: rf.Fleet, decided: list[str]) -> None:
    """A person working the approvals inbox: approves the first refund asked for."""
    for _ in range(1200):
        pending = fleet.approvals.list(identity="support/*")
        if pending:
            fleet.approvals.resolve(pending[0].id, approved=True, by="maria", comment="goodwill")
            decided.append(f"{pending[0].subject} {pending[0].data['arguments']}")
            return
        time.sleep(0.05)


def ask(desk: rf.AgentRef, message: str) -> str:
    """One customer message; the answer streams as the model writes it."""
    print(f"customer: {message}\nfront:    ", end="", flush=True)
    turn = desk.start("chat", message=message)
    for event in turn.events():
        if event.kind == "delta":
            print(event.data, end="", flush=True)
        elif event.kind == "tool_call":
            print(f"[{event.data['name']} {event.data['arguments']}] ", end="", flush=True)
    answer: str = turn.result(timeout=120)
    print()
    return answer


def main() -> None:
    with ScriptedModelServer(model, chunk_delay=0.01) as server:
        fleet = rf.connect()
        Front, Escalations = desks(server.url)
        fleet.spawn("billing/eu", Billing)
        fleet.spawn("support/escalations", Escalations)
        front = fleet.spawn("support/front", Front)

        where = ask(front, "Where is my order 42?")
        decided: list[str] = []
        inbox = threading.Thread(target=manager, args=(fleet, decided))
        inbox.start()
        refund = ask(front, "Please refund 30 EUR on order 42, it came damaged.")
        inbox.join(timeout=120)
        print(f"manager:  approved {decided}")
        escalated = ask(front, "I still want to talk to a manager.")
        refunds = fleet.agent("billing/eu").call(Billing.refunded)
        served = server.served

    conclude("support_desk", {
        "the front desk looked the order up with its own tool": where.startswith("Order 42 left the warehouse"),
        "the refund waited for a manager, then ran once at billing": (
            refund == "Done: 30 EUR are refunded on order 42." and refunds == {"42": 30} and len(decided) == 1),
        "the handoff's answer came from the escalation desk": escalated.startswith("This is the escalation desk"),
        "each model call was made once (2 + 2 + 2 requests)": served == 6,
    })


if __name__ == "__main__":
    main()
