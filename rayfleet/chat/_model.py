"""``rf.Model``: which chat model an agent talks to, and how (resolved on the host that runs it)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import InvalidSpecError
from ..llm._chat import ChatClient

URL_VARIABLE = "RAYFLEET_MODEL_URL"
MODEL_VARIABLE = "RAYFLEET_MODEL"
API_KEY_VARIABLE = "RAYFLEET_MODEL_API_KEY"


@dataclass(frozen=True, slots=True)
class Model:
    """An OpenAI-compatible chat model: vLLM, Ray Serve LLM, LiteLLM's proxy, OpenAI, or the scripted server.

    What is not given is read from the environment of the process that calls the model
    (the host running the agent): ``RAYFLEET_MODEL_URL``, ``RAYFLEET_MODEL`` and
    ``RAYFLEET_MODEL_API_KEY``. So one agent class serves against different servers in
    different deployments, and the key never travels in the agent's definition.

    Attributes:
        model: the model name sent with each request.
        base_url: the API root, e.g. ``"http://vllm:8000/v1"``.
        api_key: sent as a bearer token.
        timeout: seconds one request may take (a streamed one: the longest silence).
        connect_timeout: seconds to open a connection.
        max_retries: retries of a busy server (429, 5xx) or a lost connection.
    """

    model: str | None = None
    base_url: str | None = None
    api_key: str | None = None
    timeout: float = 60.0
    connect_timeout: float = 10.0
    max_retries: int = 2

    def client(self) -> ChatClient:
        """A client for this model, settings completed from the environment.

        Raises:
            InvalidSpecError: no base URL or model name, here or in the environment, or a
                setting the client refuses.
        """
        base_url = self.base_url or os.environ.get(URL_VARIABLE)
        model = self.model or os.environ.get(MODEL_VARIABLE)
        if not base_url:
            raise InvalidSpecError(f"rf.Model needs base_url=..., or {URL_VARIABLE} set on the hosts",
                                   field="base_url")
        if not model:
            raise InvalidSpecError(f"rf.Model needs a model name, or {MODEL_VARIABLE} set on the hosts", field="model")
        return ChatClient(base_url, model=model, api_key=self.api_key or os.environ.get(API_KEY_VARIABLE),
                          timeout=self.timeout, connect_timeout=self.connect_timeout, max_retries=self.max_retries)
