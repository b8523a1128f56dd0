"""The official openai SDK, pointed at a base URL on loopback (plain HTTP, so no TLS context to build)."""

from __future__ import annotations

import openai


def async_client(base: str, api_key: str = "sk-test", **options: object) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(api_key=api_key, base_url=f"{base}/v1", max_retries=0,
                              http_client=openai.DefaultAsyncHttpxClient(verify=False), **options)


def sync_client(base: str, api_key: str = "sk-test", **options: object) -> openai.OpenAI:
    return openai.OpenAI(api_key=api_key, base_url=f"{base}/v1", max_retries=0,
                         http_client=openai.DefaultHttpxClient(verify=False), **options)
