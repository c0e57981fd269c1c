"""``@rf.tool`` and ``rf.ChatAgent`` class definitions: the JSON Schema a model sees, argument validation,
and the definition errors a user meets when the class is defined. No Ray here."""

from __future__ import annotations

from typing import Literal

import pytest

import rayfleet as rf
from rayfleet.chat._tools import tools_of

MODEL = rf.Model("scripted", base_url="http://127.0.0.1:9/v1")


class Shop(rf.ChatAgent):
    model = MODEL

    @rf.tool
    async def find(self, query: str, limit: int = 5, sort: Literal["price", "rating"] = "price") -> list[str]:
        """Search the catalogue.

        Longer explanation that is not the summary.

        Args:
            query: what to look for,
                in the customer's words.
            limit: how many results at most.

        Returns:
            the names found.
        """
        return []

    @rf.tool(name="check-stock", description="How many are left.", idempotent=True)
    def stock(self, sku: str) -> int:
        return 3


def test_a_tool_is_described_from_its_signature_and_docstring() -> None:
    tools = tools_of(Shop)
    assert set(tools) == {"find", "check-stock"}
    find = tools["find"].definition()["function"]
    assert find["name"] == "find" and find["description"] == "Search the catalogue."
    properties = find["parameters"]["properties"]
    assert properties["query"] == {"type": "string", "description": "what to look for, in the customer's words.",
                                   "title": "Query"}
    assert properties["limit"]["type"] == "integer" and properties["limit"]["default"] == 5
    assert properties["limit"]["description"] == "how many results at most."
    assert properties["sort"]["enum"] == ["price", "rating"]
    assert find["parameters"]["required"] == ["query"]
    assert "title" not in find["parameters"]
    stock = tools["check-stock"]
    assert stock.description == "How many are left." and stock.idempotent and stock.method == "stock"
    assert not tools["find"].idempotent and not tools["find"].approval


def test_arguments_are_validated_with_a_message_the_model_can_act_on() -> None:
    find = tools_of(Shop)["find"]
    assert find.validated({"query": "tea", "limit": "7"}) == {"query": "tea", "limit": 7, "sort": "price"}
    with pytest.raises(ValueError, match=r"invalid arguments for tool find: query: Field required"):
        find.validated({})
    with pytest.raises(ValueError, match=r"sort: Input should be 'price' or 'rating'"):
        find.validated({"query": "tea", "sort": "name"})
    with pytest.raises(ValueError, match=r"colour: Extra inputs are not permitted"):
        find.validated({"query": "tea", "colour": "red"})


def test_bad_definitions_are_refused_when_the_class_is_defined() -> None:
    with pytest.raises(rf.InvalidSpecError, match=r"model must be an rf.Model"):
        class NoModel(rf.ChatAgent):
            instructions = "x"
    with pytest.raises(rf.InvalidSpecError, match=r"State must subclass rf.ChatAgent.State"):
        class PlainState(rf.ChatAgent):
            model = MODEL

            class State(rf.State):
                n: int = 0
    with pytest.raises(rf.InvalidSpecError, match=r"max_iterations must be an integer >= 1"):
        class NoIterations(rf.ChatAgent):
            model = MODEL
            max_iterations = 0
    with pytest.raises(rf.InvalidSpecError, match=r"needs a type annotation"):
        class Untyped(rf.ChatAgent):
            model = MODEL

            @rf.tool
            def look(self, where) -> str:  # type: ignore[no-untyped-def]
                return ""
    with pytest.raises(rf.InvalidSpecError, match=r"\*args and \*\*kwargs"):
        class Variadic(rf.ChatAgent):
            model = MODEL

            @rf.tool
            def look(self, **where: str) -> str:
                return ""
    with pytest.raises(rf.InvalidSpecError, match=r"needs a name of letters"):
        class BadName(rf.ChatAgent):
            model = MODEL

            @rf.tool(name="look around")
            def look(self) -> str:
                return ""
    with pytest.raises(rf.InvalidSpecError, match=r"two tools named 'look'"):
        class Twice(rf.ChatAgent):
            model = MODEL

            @rf.tool(name="look")
            def first(self) -> str:
                return ""

            @rf.tool(name="look")
            def second(self) -> str:
                return ""


def test_an_empty_subclass_is_checked_when_an_instance_is_made() -> None:
    class Empty(rf.ChatAgent):
        pass

    with pytest.raises(rf.InvalidSpecError, match=r"Empty.model must be an rf.Model"):
        Empty()
    assert isinstance(type("Kept", (Shop,), {})(), Shop)  # a subclass of a complete agent is complete


def test_a_model_takes_what_it_lacks_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAYFLEET_MODEL_URL", raising=False)
    monkeypatch.delenv("RAYFLEET_MODEL", raising=False)
    with pytest.raises(rf.InvalidSpecError, match="RAYFLEET_MODEL_URL"):
        rf.Model("m").client()
    with pytest.raises(rf.InvalidSpecError, match="RAYFLEET_MODEL set on the hosts"):
        rf.Model(base_url="http://127.0.0.1:9/v1").client()
    monkeypatch.setenv("RAYFLEET_MODEL_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("RAYFLEET_MODEL", "from-env")
    monkeypatch.setenv("RAYFLEET_MODEL_API_KEY", "sk-env")
    client = rf.Model(timeout=5).client()
    assert (client.url, client.model, client.timeout) == ("http://127.0.0.1:9/v1/chat/completions", "from-env", 5.0)
    assert client._headers(stream=False)["Authorization"] == "Bearer sk-env"
    assert rf.Model("explicit").client().model == "explicit"


def test_peer_tools_are_checked_when_made_and_when_the_class_is_defined() -> None:
    class Billing(rf.Agent):
        @rf.handler
        async def refund(self, eur: int) -> str:
            return f"{eur}"

    made = rf.peer_tool("billing/eu", Billing.refund, approval=True)
    assert (made.target, made.method, made.tool_name, made.approval) == ("billing/eu", "refund", "refund", True)
    assert rf.peer_tool("billing/eu", "refund", name="refund-eu").tool_name == "refund-eu"
    with pytest.raises(rf.InvalidSpecError, match="identity"):
        rf.peer_tool("", "refund")
    with pytest.raises(rf.InvalidSpecError, match="a tool name is letters"):
        rf.peer_tool("billing/eu", "refund", name="refund money")
    with pytest.raises(rf.InvalidSpecError, match=r"tools must be a list of rf.peer_tool"):
        class OwnInTools(rf.ChatAgent):
            model = MODEL
            tools = ["refund"]  # type: ignore[list-item]
    with pytest.raises(rf.InvalidSpecError, match=r"more than one tool named find"):
        class Clash(Shop):
            tools = [rf.peer_tool("search/web", "find")]
    spec = made.spec(Billing.__rayfleet_handlers__["refund"])
    assert spec.peer == "billing/eu" and spec.idempotent and spec.approval
    assert spec.parameters["properties"]["eur"]["type"] == "integer"
    with pytest.raises(rf.InvalidSpecError, match="has no handler 'refund'"):
        made.spec(None)


def test_a_handoff_is_a_tool_named_for_its_target() -> None:
    made = rf.handoff("support/escalations-eu")
    assert made.tool_name == "transfer_to_support_escalations-eu"
    spec = made.spec()
    assert spec.handoff and spec.peer == "support/escalations-eu" and spec.method == "take_over"
    assert set(spec.parameters["properties"]) == {"note"} and spec.validated({}) == {"note": ""}
    with pytest.raises(ValueError, match="Extra inputs"):
        spec.validated({"note": "x", "urgent": True})
    assert rf.handoff("a/b", name="escalate").tool_name == "escalate"
    with pytest.raises(rf.InvalidSpecError, match="a tool name is letters"):
        rf.handoff("a/b", name="hand over")
    assert "take_over" in rf.ChatAgent.handler_names() and "chat" in rf.ChatAgent.handler_names()
