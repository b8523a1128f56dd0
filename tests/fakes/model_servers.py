"""Fake model servers that state their context windows the way vLLM, llama.cpp, OpenRouter and LiteLLM do."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import web

from tests.fakes.openai_upstream import FakeUpstream
from tests.fakes.windowed import WindowedModel

Style = Literal["vllm", "llamacpp", "openrouter", "litellm", "openai"]
Broken = Literal["garbage", "html", "500", "401"]


@dataclass
class ModelServer:
    """One server's answers; `chat` (a WindowedModel) serves completions and enforces its window when set."""

    style: Style
    windows: dict[str, int]
    chat: WindowedModel | None = None
    delay: float = 0.0                  # before answering a discovery request
    broken: Broken | None = None        # how discovery endpoints fail, if they do
    hits: Counter[str] = field(default_factory=Counter)
    seen_headers: list[dict[str, str]] = field(default_factory=list)
    url: str = ""

    @property
    def discovery_requests(self) -> int:
        return sum(count for path, count in self.hits.items() if not path.endswith("/chat/completions"))

    def build(self) -> web.Application:
        app = web.Application(middlewares=[self._record])
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/props", self._props)
        for path in ("/model/info", "/v1/model/info"):
            app.router.add_get(path, self._model_info)
        app.router.add_post("/v1/chat/completions", self._chat)
        return app

    @web.middleware
    async def _record(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.hits[request.path] += 1
        if request.method == "GET":
            self.seen_headers.append(dict(request.headers))
            await asyncio.sleep(self.delay)
            failure = _failure(self.broken)
            if failure is not None:
                return failure
        response: web.StreamResponse = await handler(request)
        return response

    async def _models(self, request: web.Request) -> web.Response:
        entries = [_LISTINGS[self.style](name, window) for name, window in self.windows.items()]
        return web.json_response({"object": "list", "data": entries})

    async def _props(self, request: web.Request) -> web.Response:
        if self.style != "llamacpp":
            raise web.HTTPNotFound()
        (name, window), = self.windows.items()
        return web.json_response({
            "default_generation_settings": {"id": 0, "n_ctx": window, "speculative": False, "is_processing": False,
                                            "params": {"n_predict": -1, "temperature": 0.8, "top_k": 40}},
            "total_slots": 1, "model_alias": name, "model_path": f"/models/{name}.gguf",
            "modalities": {"vision": False, "audio": False}, "chat_template": "{{ messages }}",
            "build_info": "b5000-0123abcd", "is_sleeping": False})

    async def _model_info(self, request: web.Request) -> web.Response:
        if self.style != "litellm":
            raise web.HTTPNotFound()
        data = [{"model_name": name, "litellm_params": {"model": f"openai/{name}", "api_base": "http://hidden"},
                 "model_info": {"id": f"deployment-{name}", "db_model": False, "key": name,
                                "max_tokens": 4096, "max_input_tokens": window, "max_output_tokens": 4096,
                                "input_cost_per_token": 1.5e-07, "mode": "chat"}}
                for name, window in self.windows.items()]
        return web.json_response({"data": data})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        if self.chat is None:
            raise web.HTTPNotFound()
        return await self.chat(request, await request.json(), FakeUpstream())


def _failure(broken: Broken | None) -> web.Response | None:
    if broken == "garbage":
        return web.Response(body=b'{"data": [{"id": "m", "max_model_len": ', content_type="application/json")
    if broken == "html":
        return web.Response(text="<html><body>Welcome</body></html>", content_type="text/html")
    if broken == "500":
        return web.json_response({"error": {"message": "boom"}}, status=500)
    if broken == "401":
        return web.json_response({"error": {"message": "Invalid API key"}}, status=401)
    return None


def _vllm(name: str, window: int) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 1700000000, "owned_by": "vllm", "root": f"/models/{name}",
            "parent": None, "max_model_len": window,
            "permission": [{"id": "modelperm-1", "object": "model_permission", "allow_sampling": True}]}


def _llamacpp(name: str, window: int) -> dict[str, Any]:
    # llama-server names the model's training context here, not the context it was started with.
    return {"id": name, "object": "model", "created": 1700000000, "owned_by": "llamacpp",
            "meta": {"vocab_type": 2, "n_vocab": 151936, "n_ctx_train": 131072, "n_embd": 896,
                     "n_params": 494032768, "size": 1033457664}}


def _openrouter(name: str, window: int) -> dict[str, Any]:
    return {"id": name, "canonical_slug": name, "name": name.title(), "created": 1700000000,
            "description": "A model.", "context_length": window,
            "architecture": {"modality": "text->text", "tokenizer": "Llama3", "instruct_type": None},
            "pricing": {"prompt": "0.0000001", "completion": "0.0000002"},
            "top_provider": {"context_length": window, "max_completion_tokens": 4096, "is_moderated": False},
            "per_request_limits": None, "supported_parameters": ["max_tokens", "temperature", "tools"]}


def _plain(name: str, window: int) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 1700000000, "owned_by": "openai"}


_LISTINGS = {"vllm": _vllm, "llamacpp": _llamacpp, "openrouter": _openrouter, "litellm": _plain, "openai": _plain}
