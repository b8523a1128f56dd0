"""Fixtures for the real-model suite: one llama.cpp server for the whole session, and the real_model mark."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e_real.model_server import (
    DEFAULT_CACHE_DIR,
    DEFAULT_N_CTX,
    LlamaServer,
    ModelServerError,
    find_llama_python,
    locate_model,
    start_llama_server,
)

HERE = Path(__file__).resolve().parent
LOG_DIR = DEFAULT_CACHE_DIR.parent / "logs"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test in this folder needs (or belongs with) the real model server."""
    for item in items:
        if Path(str(item.path)).resolve().is_relative_to(HERE):
            item.add_marker(pytest.mark.real_model)


@pytest.fixture(scope="session")
def llama_server() -> Iterator[LlamaServer]:
    """SmolLM2-135M behind llama-cpp-python's OpenAI server. A missing piece fails the run: it is never skipped."""
    try:
        model = locate_model(os.environ)
        python = find_llama_python(os.environ)
        server = start_llama_server(python, model, n_ctx=DEFAULT_N_CTX, log_path=LOG_DIR / "llama_server.log")
    except ModelServerError as error:
        pytest.fail(f"the real model server is not available: {error}", pytrace=False)
    print(f"\nmodel server {server.url} (pid {server.process.pid}, n_ctx {server.n_ctx}, log {server.log_path})")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def llama_server_1024() -> Iterator[LlamaServer]:
    """SmolLM2-135M at n_ctx 1024: a window smaller than the built-in summariser prompt was written for."""
    try:
        model = locate_model(os.environ)
        python = find_llama_python(os.environ)
        server = start_llama_server(python, model, n_ctx=1024, log_path=LOG_DIR / "llama_server_1024.log")
    except ModelServerError as error:
        pytest.fail(f"the real model server is not available: {error}", pytrace=False)
    print(f"\nmodel server {server.url} (pid {server.process.pid}, n_ctx {server.n_ctx}, log {server.log_path})")
    yield server
    server.stop()
