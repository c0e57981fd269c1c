"""``rf.ChatClient`` speaking the whole chat completions protocol to ``rf.testing.ScriptedModelServer``.

Both are real: the server is an aiohttp app on 127.0.0.1 answering over HTTP from a
script, the client parses what came over the wire. Tool calls, parallel calls, streamed
text and tool-call argument deltas, usage in streams, ``Retry-After``, timeouts, broken
streams and bad input.
"""

from __future__ import annotations

import email.utils
import json
from collections.abc import Iterator

import pytest

import rayfleet as rf
from rayfleet.llm._chat import retry_after_seconds
from rayfleet.testing import ScriptedModelServer, ScriptedReply

WEATHER = {"type": "function", "function": {
    "name": "weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "local_time", "parameters": {"type": "object", "properties": {}}}}
TWO_CALLS = ScriptedReply(tool_calls=[rf.ToolCall("call_a", "weather", '{"city": "Oslo"}'),
                                      rf.ToolCall("call_b", "weather", '{"city": "Lima, Peru"}')])


@pytest.fixture
def served() -> Iterator[ScriptedModelServer]:
    """A server whose script the test sets (``server._replies``) before its first request."""
    with ScriptedModelServer(["unused"]) as server:
        yield server


def client_of(server: ScriptedModelServer, **options: object) -> rf.ChatClient:
    return rf.ChatClient(server.url, model="scripted", **options)  # type: ignore[arg-type]


async def test_parallel_tool_calls_are_read_and_their_results_sent_back_as_a_valid_transcript() -> None:
    with ScriptedModelServer([TWO_CALLS, "Oslo is cold, Lima is mild."]) as server:
        async with client_of(server) as client:
            question = [{"role": "user", "content": "weather in Oslo and Lima?"}]
            reply = await client.chat(question, tools=[WEATHER, TIME], tool_choice="auto", parallel_tool_calls=True)
            assert reply.text == "" and reply.finish_reason == "tool_calls"
            assert [(c.id, c.name, c.parsed_arguments()) for c in reply.tool_calls] == [
                ("call_a", "weather", {"city": "Oslo"}), ("call_b", "weather", {"city": "Lima, Peru"})]
            assert reply.usage == rf.Usage(prompt_tokens=5, completion_tokens=5)
            transcript = [*question, reply.message,
                          *(rf.ChatMessage.tool_result(call, f"{call.parsed_arguments()['city']}: 4C")
                            for call in reply.tool_calls)]
            final = await client.chat(transcript, tools=[WEATHER, TIME])
        assert final.text == "Oslo is cold, Lima is mild." and final.tool_calls == ()
        first, second = server.requests
    assert first["tools"] == [WEATHER, TIME] and first["tool_choice"] == "auto"
    assert first["parallel_tool_calls"] is True and "stream" not in first
    assert second["messages"][1] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_a", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}},
        {"id": "call_b", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Lima, Peru"}'}}]}
    assert second["messages"][2:] == [{"role": "tool", "content": "Oslo: 4C", "tool_call_id": "call_a"},
                                      {"role": "tool", "content": "Lima, Peru: 4C", "tool_call_id": "call_b"}]


async def test_a_transcript_given_as_protocol_dicts_round_trips_with_null_content() -> None:
    with ScriptedModelServer(["done"]) as server:
        async with client_of(server) as client:
            await client.chat([
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}]},
                {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
            ], tool_choice={"type": "function", "function": {"name": "weather"}}, tools=[WEATHER])
        sent = server.requests[0]
    assert sent["messages"][1]["content"] is None and sent["messages"][1]["tool_calls"][0]["id"] == "c1"
    assert sent["messages"][2] == {"role": "tool", "content": "sunny", "tool_call_id": "c1"}


async def test_a_streamed_reply_arrives_in_text_deltas_with_usage_from_its_last_chunk() -> None:
    text = "The tide turns twice a day here."
    with ScriptedModelServer([text, text]) as server:
        async with client_of(server) as client:
            deltas = []
            async with client.stream([{"role": "user", "content": "tell me about tides"}], temperature=0) as stream:
                async for delta in stream:
                    deltas.append(delta)
            whole = await client.chat([{"role": "user", "content": "tell me about tides"}])
        streamed_request = server.requests[0]
    assert len(deltas) == len(text.split()) and all(d.tool_index is None for d in deltas)
    assert "".join(d.text for d in deltas) == text
    assert stream.reply.text == text and stream.reply.finish_reason == "stop"
    assert stream.reply.usage == whole.usage == rf.Usage(prompt_tokens=4, completion_tokens=7)
    assert streamed_request["stream"] is True
    assert streamed_request["stream_options"] == {"include_usage": True} and streamed_request["temperature"] == 0


async def test_streamed_tool_calls_arrive_as_argument_fragments_and_are_assembled_by_index() -> None:
    with ScriptedModelServer([ScriptedReply(text="Checking.", tool_calls=TWO_CALLS.tool_calls)]) as server:
        async with client_of(server) as client:
            stream = client.stream([{"role": "user", "content": "weather?"}], tools=[WEATHER])
            deltas = [delta async for delta in stream]  # iterated without `async with`: closed at the end
    fragments = [d for d in deltas if d.tool_index == 0 and d.arguments]
    assert len(fragments) > 1, "the arguments of one call come in several deltas"
    assert "".join(d.arguments for d in fragments) == '{"city": "Oslo"}'
    starts = [(d.tool_index, d.tool_call_id, d.tool_name) for d in deltas if d.tool_call_id]
    assert starts == [(0, "call_a", "weather"), (1, "call_b", "weather")]
    assert stream.reply.text == "Checking." and stream.reply.finish_reason == "tool_calls"
    assert stream.reply.tool_calls == tuple(TWO_CALLS.tool_calls)
    assert stream.reply.message.tool_calls == tuple(TWO_CALLS.tool_calls)


async def test_a_stream_without_usage_asked_counts_zero_tokens_and_finish_reads_the_rest() -> None:
    with ScriptedModelServer(["no usage for you"]) as server:
        async with client_of(server) as client:
            stream = client.stream([{"role": "user", "content": "x"}], stream_options={"include_usage": False})
            with pytest.raises(rf.UsageError, match="not complete"):
                _ = stream.reply
            reply = await stream.finish()
    assert reply.text == "no usage for you" and reply.usage == rf.Usage()


async def test_a_429_waits_the_retry_after_the_server_asked_for() -> None:
    script = [ScriptedReply(status=429, retry_after=0.6), "after the wait"]
    with ScriptedModelServer(script) as server:
        async with client_of(server, max_retries=1) as client:
            reply = await client.chat([{"role": "user", "content": "x"}])
        first, second = server.received_at
    assert reply.text == "after the wait"
    # The backoff without the header would be 0.25 s: the gap shows the header was honoured.
    assert second - first >= 0.6


async def test_a_streamed_request_is_retried_after_a_503_with_retry_after_before_its_reply_begins() -> None:
    script = [ScriptedReply(status=503, retry_after=0.1), "back again"]
    with ScriptedModelServer(script) as server:
        async with client_of(server, max_retries=1) as client:
            reply = await client.stream([{"role": "user", "content": "x"}]).finish()
        assert server.served == 2
    assert reply.text == "back again"


async def test_a_retry_after_longer_than_the_client_waits_ends_the_call_with_it() -> None:
    with ScriptedModelServer([ScriptedReply(status=429, retry_after=120), "never"]) as server:
        async with client_of(server, max_retries=3, max_retry_after=5) as client:
            with pytest.raises(rf.ModelUnavailableError) as caught:
                await client.chat([{"role": "user", "content": "x"}])
        assert server.served == 1, "not retried: the server said two minutes"
    assert caught.value.retry_after == 120 and caught.value.attempts == 1
    assert "max_retry_after" in str(caught.value) and "429" in str(caught.value)


def test_retry_after_reads_seconds_and_http_dates() -> None:
    assert retry_after_seconds("7") == 7.0
    assert retry_after_seconds(" 1.5 ") == 1.5
    assert retry_after_seconds(None) is None and retry_after_seconds("soon") is None
    date = email.utils.formatdate(1_000_030, usegmt=True)
    assert retry_after_seconds(date, now=1_000_000) == 30.0
    assert retry_after_seconds(date, now=2_000_000) == 0.0  # already past: try now


async def test_a_slow_reply_times_out_and_a_stalled_stream_times_out_between_chunks() -> None:
    with ScriptedModelServer([ScriptedReply(text="late", delay=2.0)]) as server:
        async with client_of(server, timeout=0.3, max_retries=2) as client:
            with pytest.raises(rf.ModelTimeoutError) as caught:
                await client.chat([{"role": "user", "content": "x"}])
        assert server.served == 1, "a timeout is not retried"
    assert caught.value.streamed is False and caught.value.timeout == 0.3
    with ScriptedModelServer(["one two three four"], chunk_delay=1.0) as server:
        async with client_of(server, timeout=0.3) as client:
            got = []
            with pytest.raises(rf.ModelTimeoutError) as caught:
                async for delta in client.stream([{"role": "user", "content": "x"}]):
                    got.append(delta)
    assert caught.value.streamed is True and "sent nothing of its streamed reply" in str(caught.value)
    assert got == [], "the first chunk (the role) carries no delta; the timeout came before the text"


async def test_a_stream_that_breaks_off_mid_reply_is_an_error_and_is_not_retried() -> None:
    with ScriptedModelServer([ScriptedReply(text="a b c d e f", break_after=3), "never"]) as server:
        async with client_of(server, max_retries=2) as client:
            got = []
            with pytest.raises(rf.ModelUnavailableError) as caught:
                async for delta in client.stream([{"role": "user", "content": "x"}]):
                    got.append(delta.text)
        assert server.served == 1
    assert got == ["a", " b"] and "chunk" in caught.value.last_failure


async def test_server_failures_and_garbage_end_in_typed_errors() -> None:
    script = [ScriptedReply(status=200, body="<html>not json</html>"),
              ScriptedReply(body=json.dumps({"choices": [{"message": {"role": "assistant", "content": None,
                                                                       "tool_calls": [{"id": "x", "function": {}}]}}]})),
              ScriptedReply(status=500), ScriptedReply(status=500)]
    with ScriptedModelServer(script) as server:
        async with client_of(server, max_retries=1) as client:
            with pytest.raises(rf.ModelResponseError, match="not JSON"):
                await client.chat([{"role": "user", "content": "x"}])
            with pytest.raises(rf.ModelResponseError, match=r"tool_calls\[0\] is malformed"):
                await client.chat([{"role": "user", "content": "x"}])
            with pytest.raises(rf.ModelUnavailableError, match="HTTP 500"):
                await client.chat([{"role": "user", "content": "x"}])
            with pytest.raises(rf.ModelUnavailableError, match="the script held 4 replies"):
                await client.chat([{"role": "user", "content": "x"}])


async def test_a_wrong_api_key_is_refused_and_not_retried() -> None:
    with ScriptedModelServer(["hi"], api_key="sk-right") as server:
        async with rf.ChatClient(server.url, model="m", api_key="sk-wrong", max_retries=2) as client:
            with pytest.raises(rf.ModelRequestError) as caught:
                await client.chat([{"role": "user", "content": "x"}])
        assert server.served == 0
    assert caught.value.status == 401


async def test_bad_tools_and_parameters_are_refused_before_anything_is_sent() -> None:
    with ScriptedModelServer(["unused"]) as server:
        client = client_of(server)
        message = [{"role": "user", "content": "x"}]
        for params, field in [({"tools": {"name": "weather"}}, "tools"),
                              ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools"),
                              ({"tools": [WEATHER, WEATHER]}, "tools"),
                              ({"tool_choice": "sometimes"}, "tool_choice"),
                              ({"stream": True}, "stream"),
                              ({"stream_options": {"include_usage": True}}, "stream_options"),
                              ({"model": "other"}, "model")]:
            with pytest.raises(rf.InvalidSpecError) as caught:
                await client.chat(message, **params)
            assert caught.value.field == field
        with pytest.raises(rf.InvalidSpecError, match="tool_choice"):
            client.stream(message, tool_choice=["auto"])
        await client.close()
        assert server.served == 0


def test_messages_and_tool_calls_check_their_fields() -> None:
    with pytest.raises(rf.InvalidSpecError, match="tool_call_id"):
        rf.ChatMessage("tool", "42")
    with pytest.raises(rf.InvalidSpecError, match="only an assistant message calls tools"):
        rf.ChatMessage("user", "x", tool_calls=(rf.ToolCall("c", "weather"),))
    with pytest.raises(rf.InvalidSpecError, match="non-empty string name"):
        rf.ToolCall("c", "")
    with pytest.raises(ValueError, match="are not JSON"):
        rf.ToolCall("c", "weather", '{"city": ').parsed_arguments()
    with pytest.raises(ValueError, match="must be a JSON object"):
        rf.ToolCall("c", "weather", "[1]").parsed_arguments()
    assert rf.ToolCall("c", "weather", "").parsed_arguments() == {}


def test_the_scripted_server_refuses_a_bad_script_and_names_its_url_only_while_running() -> None:
    with pytest.raises(rf.InvalidSpecError, match="non-empty list"):
        ScriptedModelServer([])
    with pytest.raises(rf.InvalidSpecError, match=r"script\[1\]"):
        ScriptedModelServer(["ok", 3])  # type: ignore[list-item]
    server = ScriptedModelServer(lambda body: f"you said {body['messages'][-1]['content']}")
    with pytest.raises(rf.UsageError, match="not running"):
        _ = server.url
    with server:
        assert server.url.startswith("http://127.0.0.1:")
