"""An offline chat model that answers from a script: deterministic demos and tests without a server."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import InvalidSpecError
from ..identity._handlers import Usage
from ._values import ChatMessage, ChatReply, coerce_messages


class ScriptedModel:
    """An offline chat model that answers from a script, for demos and tests.

    Replies come back in order and the script repeats once exhausted. Usage is
    counted in words: ``prompt_tokens`` is the words of every message sent, and
    ``completion_tokens`` the words of the reply, each times ``tokens_per_word``.

    Args:
        replies: the answers, in order; at least one.
        tokens_per_word: tokens charged per word, a positive integer.

    Raises:
        InvalidSpecError: when ``replies`` is empty or not all strings, or
            ``tokens_per_word`` is not a positive integer.
    """

    model = "scripted"

    def __init__(self, replies: list[str], *, tokens_per_word: int = 1) -> None:
        if isinstance(replies, str) or not isinstance(replies, (list, tuple)) or not replies:
            raise InvalidSpecError("replies must be a non-empty list of strings", field="replies")
        if not all(isinstance(reply, str) for reply in replies):
            raise InvalidSpecError(f"every reply must be a string, got {replies!r}", field="replies")
        if isinstance(tokens_per_word, bool) or not isinstance(tokens_per_word, int) or tokens_per_word < 1:
            raise InvalidSpecError(f"tokens_per_word must be a positive integer, got {tokens_per_word!r}",
                                   field="tokens_per_word")
        self.replies: tuple[str, ...] = tuple(replies)
        self.tokens_per_word = tokens_per_word
        self._calls = 0

    @property
    def calls(self) -> int:
        """How many chats this model has answered."""
        return self._calls

    def __repr__(self) -> str:
        return f"ScriptedModel({len(self.replies)} replies, tokens_per_word={self.tokens_per_word})"

    async def chat(self, messages: Iterable[ChatMessage | Mapping[str, Any]], **params: Any) -> ChatReply:
        """Answer with the next scripted reply; ``params`` are accepted and ignored.

        Raises:
            InvalidSpecError: when ``messages`` is empty or malformed.
        """
        coerced = coerce_messages(messages)
        # No await between reading and advancing the counter, so concurrent chats on one loop never share a reply.
        text = self.replies[self._calls % len(self.replies)]
        self._calls += 1
        usage = Usage(
            prompt_tokens=sum(len(m.content.split()) for m in coerced) * self.tokens_per_word,
            completion_tokens=len(text.split()) * self.tokens_per_word,
        )
        raw = {
            "object": "chat.completion",
            "model": self.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
                      "total_tokens": usage.total_tokens},
        }
        return ChatReply(text=text, usage=usage, model=self.model, finish_reason="stop", raw=raw)
