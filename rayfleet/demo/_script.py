"""``rayfleet demo``: a few agents with state, a host killed on purpose, state shown to survive."""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import ray

from ..errors import InvalidStateError
from ..llm._scripted_server import ScriptedModelServer, ScriptedReply
from ..llm._values import ToolCall
from ..platform._fleet import Fleet, connect
from ..platform._runner import RUNNER_ACTOR_NAME
from ..workflow._definition import Budget, Quorum, RunStatus, Select, Workflow
from .agents import Bank, Booking, Counter, Notebook, Refunds, Reviewer, support_desk

DEMO_NAMESPACE = "rayfleet-demo"


def run_demo(
    *, storage: str | None = None, address: str | None = None, ledger: str | None = None,
    say: Callable[[str], None] = print,
) -> int:
    """Run the demo end to end; returns 0 when every check held.

    ``ledger=None`` means what it means for :func:`rayfleet.connect` (``RAYFLEET_LEDGER``,
    else SQLite in the storage folder).
    """
    storage = storage or tempfile.mkdtemp(prefix="rayfleet-demo-")
    started = time.perf_counter()
    fleet = connect(address=address, storage=storage, ledger=ledger, namespace=DEMO_NAMESPACE, hosts=2)
    try:
        say(f"1. Connected: {len(fleet.hosts())} host actors ({', '.join(h.name for h in fleet.hosts())}), "
            f"storage in {fleet.storage}.")
        alice = fleet.spawn("counter/alice", Counter, labels={"team": "a"})
        bob = fleet.spawn("counter/bob", Counter, labels={"team": "b"})
        notes = fleet.spawn("notes/ops", Notebook)
        say("2. Spawned three agents by name: counter/alice, counter/bob, notes/ops.")
        alice.call(Counter.add, n=2)
        total = alice.call(Counter.add, n=3)
        bob.call(Counter.add, n=40)
        notes.call(Notebook.write, author="alice", text="deploy at noon")
        notes.call(Notebook.write, author="bob", text="rollback plan ready")
        before = fleet.status("counter/alice")
        say(f"3. counter/alice added 2 then 3 and holds {total}. It lives on {before.host} with fencing token "
            f"{before.lease.fencing_token if before.lease else '-'}; checkpoint version {before.checkpoint_version} "
            f"is committed to the ledger.")
        victim = before.host
        assert victim is not None
        victim_handle = ray.get_actor(victim, namespace=DEMO_NAMESPACE)
        ray.kill(victim_handle)
        # ray.kill returns before the process is gone: until Ray reports it dead the dying host may
        # still serve the next call under its old token, and step 5 would show no new owner.
        with contextlib.suppress(ray.exceptions.RayActorError):
            while True:
                ray.get(victim_handle.__ray_ready__.remote())
        say(f"4. Killed host actor {victim} on purpose (ray.kill), without any warning to it.")
        # The key makes a retry of this call (by the caller, after a lost reply) take effect once;
        # without one a retried call is at-least-once.
        after_total = alice.call(Counter.add, n=1, idempotency_key="demo-after-kill")
        after = fleet.status("counter/alice")
        token_before = before.lease.fencing_token if before.lease else 0
        token_after = after.lease.fencing_token if after.lease else 0
        say(f"5. Called counter/alice again (with an idempotency key): it answered {after_total} (5 + 1) from "
            f"{after.host}. The new owner took "
            f"a larger fencing token ({token_before} -> {token_after}) and resumed from the last checkpoint; "
            f"a write from the old owner would now be refused.")
        say(f"   notes/ops still reads {notes.call(Notebook.read)}; counter/bob still holds {bob.call(Counter.get)}.")
        fleet.retire("counter/bob")
        try:
            bob.call(Counter.add, n=1)
            refused = "no"
        except InvalidStateError as error:
            refused = str(error).split(".")[0]
        fleet.respawn("counter/bob")
        say(f"6. Retired counter/bob: a call was refused ({refused}). "
            f"Respawned it: it holds {bob.call(Counter.get)} again.")
        fleet.reset("notes/ops")
        generation = fleet.status("notes/ops").generation
        say(f"7. Reset notes/ops: generation {generation}, fresh notes {notes.call(Notebook.read)}.")
        saga_ok = _trip_saga(fleet, say)
        approval_ok = _approved_refund(fleet, say)
        model_ok = _model_agent(fleet, say)
        ok = (after_total == 6 and token_after > token_before and bob.call(Counter.get) == 40 and saga_ok
              and approval_ok and model_ok)
        say(f"Demo {'passed' if ok else 'FAILED'} in {time.perf_counter() - started:.1f}s: state survived a host "
            f"crash with exactly one owner per identity, the sagas compensated and resumed, a suspended turn "
            f"resumed on its approval, and a model agent called its tool durably.")
        return 0 if ok else 1
    finally:
        fleet.shutdown(stop_actors=True)


def _trip(name: str, *, amount: int, delay: float = 0.0) -> Workflow:
    workflow = Workflow(name, budget=Budget(invocations=20, wall_clock=60.0, tokens=50_000))
    workflow.step("flight", to="airline/main", call="reserve", payload=lambda ctx: {"trip": ctx.run_id}) \
        .compensate("cancel").exclusive()
    workflow.step("hotel", to="hotel/main", call="reserve", payload=lambda ctx: {"trip": ctx.run_id, "nights": 2},
                  after=["flight"]).compensate("cancel")
    workflow.step("reviews", scatter=Select(labels={"role": "reviewer"}), call="review",
                  payload=lambda ctx: {"trip": ctx.run_id}, gather=Quorum(2), after=["hotel"])
    workflow.step("pay", to="bank/main", call="charge",
                  payload=lambda ctx: {"trip": ctx.run_id, "amount": amount, "delay": delay},
                  after=["reviews"]).verify(lambda out: out["ok"])
    return workflow


def _trip_saga(fleet: Fleet, say: Callable[[str], None]) -> bool:
    fleet.spawn("airline/main", Booking)
    fleet.spawn("hotel/main", Booking)
    fleet.spawn("bank/main", Bank)
    for index in range(3):
        fleet.spawn(f"reviewer/{index}", Reviewer, labels={"role": "reviewer"})
    good = fleet.run(_trip("trip-ok", amount=300))
    say(f"8. Trip saga: flight (exclusive, fenced) -> hotel -> 3 reviewers (quorum 2) -> payment: {good.status.value}, "
        f"{good.invocations} dispatches, {good.usage_tokens} tokens.")
    bad = fleet.run(_trip("trip-declined", amount=5000))
    say(f"9. A declined payment: {bad.status.value}; compensated in reverse order: {', '.join(bad.compensated)} "
        f"({str(bad.error).split(';')[0]}).")
    run_id = fleet.submit(_trip("trip-resumed", amount=200, delay=3.0))
    for _ in range(200):
        if fleet.agent("hotel/main").call(Booking.report)["reservations"].get(run_id):
            break
        time.sleep(0.05)
    ray.kill(ray.get_actor(RUNNER_ACTOR_NAME, namespace=DEMO_NAMESPACE), no_restart=False)
    resumed = fleet.runs.wait(run_id, timeout=60)
    airline = fleet.agent("airline/main").call(Booking.report)
    say(f"10. Submitted a third trip and killed its runner actor mid-run; Ray restarted it and it resumed from the "
        f"journal: {resumed.status.value}. The airline reserved {airline['calls']} times for 3 trips "
        f"(journaled steps were re-derived, not re-executed).")
    return (good.status is RunStatus.COMPLETED and bad.status is RunStatus.COMPENSATED
            and bad.compensated == ("hotel", "flight") and resumed.status is RunStatus.COMPLETED
            and airline["calls"] == 3)


def _approved_refund(fleet: Fleet, say: Callable[[str], None]) -> bool:
    refunds = fleet.spawn("refunds/eu", Refunds)
    with ThreadPoolExecutor(1) as pool:
        asked = pool.submit(refunds.call, Refunds.refund, order="A-17", eur=500, timeout=120)
        for _ in range(400):
            pending = fleet.approvals.list(identity="refunds/*")
            if pending:
                break
            time.sleep(0.05)
        (approval,) = pending
        deactivated = fleet.deactivate("refunds/eu")
        say(f"11. refunds/eu asked for a manager's approval of a 500 EUR refund and suspended: the turn is in the "
            f"ledger, waiting for approval {approval.id}; the agent was {'deactivated' if deactivated else 'left'} "
            f"while it waits, holding no host.")
        fleet.approvals.resolve(approval.id, approved=True, by="manager", comment="ok")
        answer: str = asked.result(timeout=120)
    say(f"12. The manager approved it; the turn was delivered to a host again, replayed from its journal and "
        f"finished: {answer!r}.")
    return answer == "refunded 500 EUR for A-17, approved by manager"


def _model_agent(fleet: Fleet, say: Callable[[str], None]) -> bool:
    answer_text = "Order 42 shipped this morning and arrives on Thursday."
    script: list[str | ScriptedReply] = [
        ScriptedReply(tool_calls=[ToolCall("call_1", "order_status", '{"order_id": 42}')]), answer_text]
    # A real OpenAI-compatible server on 127.0.0.1 answering from the script: rf.Model(base_url=...) pointed at
    # vLLM, Ray Serve LLM or LiteLLM is the only change for a real model.
    with ScriptedModelServer(script, chunk_delay=0.005) as server:
        desk = fleet.spawn("support/anna", support_desk(server.url))
        turn = desk.start("chat", message="Where is my order 42?")
        events = list(turn.events())
        answer: str = turn.result(timeout=120)
        served = server.served
    streamed = "".join(event.data for event in events if event.kind == "delta")
    tools = [event.data["name"] for event in events if event.kind == "tool_call"]
    say(f"13. support/anna, a model agent (rf.ChatAgent) on a scripted OpenAI-compatible server on 127.0.0.1, "
        f"called its tool {', '.join(tools) or 'nothing'} as a journaled step and streamed its answer: {answer!r} "
        f"({served} model requests).")
    return answer == answer_text and streamed == answer_text and tools == ["order_status"] and served == 2
