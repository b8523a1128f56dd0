"""Context-overflow recognition: the public corpus of real error bodies, look-alikes and window sizes."""

from __future__ import annotations

import json
import random
import re
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.upstream.overflow import (
    _COMPARISON,
    _LIMIT,
    _OUTPUT,
    _SUBJECT,
    _WINDOW,
    _input_text,
    _message_says_overflow,
    _requested_and_limit,
    context_limit_from_error,
    detect_context_overflow,
)

FIXTURES = Path(__file__).parents[1] / "fixtures"
CORPUS: list[dict[str, Any]] = json.loads((FIXTURES / "overflow_public.json").read_text(encoding="utf-8"))
# More providers' bodies, found verbatim in public issues and source code; same entry format, each with its source.
MORE: list[dict[str, Any]] = json.loads((FIXTURES / "overflow_more.json").read_text(encoding="utf-8"))
CORPUS_BY_ID = {entry["id"]: entry for entry in CORPUS + MORE}


def body_text(entry: dict[str, Any]) -> str:
    body = entry["body"]
    return body if isinstance(body, str) else json.dumps(body)


def sse(*payloads: Any) -> str:
    return "".join(f"data: {p if isinstance(p, str) else json.dumps(p)}\n\n" for p in payloads)


def error_body(message: str, **extra: Any) -> str:
    return json.dumps({"error": {"message": message, "type": "invalid_request_error", **extra}})


def completion(content: str, finish_reason: str) -> str:
    return json.dumps({"object": "chat.completion", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish_reason}]})


ROLE_ONLY = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
CONTENT = {"choices": [{"index": 0, "delta": {"content": "Hello"}}]}
OVERFLOW_MESSAGE = "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens."
BEDROCK_EXCEPTION_FRAME = (
    b"\x00\x00\x00\x9b\x00\x00\x00\x5a\x1c\x2f\x01\x2a\x0f:exception-type\x07\x00\x13validationException"
    b"\x0d:message-type\x07\x00\x09exception"
    b'{"message":"Input is too long for requested model."}\x8e\x12\x7f\x01'
)
BEDROCK_CHUNK_FRAME = (
    b"\x00\x00\x00\x80\x00\x00\x00\x4b\x11\x22\x33\x44\x0b:event-type\x07\x00\x05chunk"
    b"\x0d:message-type\x07\x00\x05event"
    b'{"bytes":"eyJ0eXBlIjoiY29udGVudF9ibG9ja19kZWx0YSJ9"}\x01\x02\x03\x04'
)


@pytest.mark.parametrize("entry", CORPUS, ids=[entry["id"] for entry in CORPUS])
def test_corpus_entry_is_classified_as_labelled(entry: dict[str, Any]) -> None:
    text = body_text(entry)
    assert detect_context_overflow(entry["status"], text) is entry["is_context_overflow"]
    assert detect_context_overflow(entry["status"], text.encode()) is entry["is_context_overflow"]


def test_corpus_agreement_is_total() -> None:
    agreed = sum(detect_context_overflow(e["status"], body_text(e)) is e["is_context_overflow"] for e in CORPUS)
    assert len(CORPUS) >= 60
    assert agreed == len(CORPUS)
    assert {e["is_context_overflow"] for e in CORPUS} == {True, False}


LOOKALIKES: list[tuple[str, int, str | bytes]] = [
    ("responses-incomplete-max-output", 200, json.dumps({"object": "response", "status": "incomplete",
        "incomplete_details": {"reason": "max_output_tokens"}, "output": []})),
    # A finished response: an error event after it is not this prompt's overflow.
    ("responses-stream-completed-then-error", 200,
        'event: response.created\ndata: {"type":"response.created"}\n\n'
        'event: response.completed\ndata: {"type":"response.completed","response":{"status":"completed",'
        '"incomplete_details":null,"output":[]}}\n\n'
        'event: error\ndata: {"type":"error","error":{"message":"' + OVERFLOW_MESSAGE + '"}}\n\n'),
    ("429-tpm-request-too-large", 429, error_body(
        "Request too large for gpt-4o on tokens per min (TPM): Limit 30000, Requested 342389.",
        code="rate_limit_exceeded")),
    ("429-even-with-overflow-words", 429, error_body(OVERFLOW_MESSAGE)),
    ("413-tpm-with-overflow-words", 413, error_body(
        "Request too large on tokens per minute (TPM): Limit 6000, please reduce the length of the messages.")),
    ("max-tokens-output-cap", 400, error_body(
        "max_tokens is too large: 6000. This model supports at most 4096 completion tokens.", param="max_tokens")),
    ("anthropic-output-cap", 400, json.dumps({"type": "error", "error": {"type": "invalid_request_error",
        "message": "max_tokens: 70000 > 64000, which is the maximum allowed number of output tokens"}})),
    ("content-filter", 400, error_body(
        "The prompt triggered the content management policy; the context window was not the issue.",
        code="content_filter")),
    ("unrelated-context-parameter", 400, error_body(
        "Unrecognized request argument supplied: context", param="context", code="unknown_parameter")),
    ("function-schema-error", 400, error_body(
        "Invalid schema for function 'lookup': In context=(), 'required' must list every key. Missing 'limit'.")),
    ("success-text-mentions-window", 200, completion(
        "The maximum context length is 8192 tokens; the prompt is too long to quote here.", "stop")),
    ("success-finish-length", 200, completion("...partial", "length")),
    ("stream-content-then-overflow-error", 200, sse(
        ROLE_ONLY, CONTENT, {"error": {"message": OVERFLOW_MESSAGE, "code": "context_length_exceeded"}})),
    ("stream-lifecycle-only", 200, 'event: response.created\ndata: {"type":"response.created"}\n\n'),
    ("stream-overloaded-first", 200, 'event: error\ndata: {"type":"error","error":{"type":"overloaded_error",'
                                     '"message":"Overloaded; context window fine"}}\n\n'),
    ("invalid-utf8", 400, b"\xff\xfe\x80\x81\xc3\x28 garbage \xed\xa0\x80"),
    ("empty-500", 500, b""),
    ("empty-413", 413, b"  \n"),
    ("empty-200", 200, b""),
    ("html-502", 502, "<html><head><title>502 Bad Gateway</title></head><body><center>nginx</center></body></html>"),
    ("error-null", 400, '{"error": null}'),
    ("lookalike-code-wins-over-words", 413, error_body(
        "Request body exceeds the size limit; reduce the length of the messages.", code="request_too_large")),
    # Deep enough to decode, too deep to walk without a bound on recursion.
    ("decodable-deep-nesting", 400, '{"error":' * 900 + '"Invalid request"' + "}" * 900),
    ("deep-list-nesting", 400, "[" * 100_000 + "]" * 100_000),
    ("deep-dict-nesting", 400, '{"error":' * 5_000 + '"Invalid request"' + "}" * 5_000),
    ("server-oom", 500, error_body("CUDA out of memory while allocating the KV cache", type="server_error")),
    ("overloaded-529", 529, json.dumps({"type": "error", "error": {"type": "overloaded_error",
                                                                   "message": "Overloaded"}})),
    ("tool-ordering", 400, error_body("An assistant message with 'tool_calls' must be followed by tool messages.")),
    ("bedrock-chunk-before-exception", 200, BEDROCK_CHUNK_FRAME + BEDROCK_EXCEPTION_FRAME),
    ("plain-200-text", 200, "Input is too long for requested model."),
]


@pytest.mark.parametrize(("status", "body"), [c[1:] for c in LOOKALIKES], ids=[c[0] for c in LOOKALIKES])
def test_lookalike_is_not_overflow(status: int, body: str | bytes) -> None:
    assert detect_context_overflow(status, body) is False


POSITIVES: list[tuple[str, int, str | bytes]] = [
    ("xai-prompt-length", 400, json.dumps({"code": "Client specified an invalid argument", "error":
        "This model's maximum prompt length is 131072 but the request contains 537812 tokens."})),
    ("mistral-too-large", 400, json.dumps({"object": "error", "message": "Prompt contains 40000 tokens and 0 draft "
        "tokens, too large for model with 32768 maximum context length", "type": "invalid_request_error"})),
    ("copilot-prompt-token-count", 400, error_body("prompt token count of 140000 exceeds the limit of 128000",
                                                  code="model_max_prompt_tokens_exceeded")),
    ("kimi-token-limit", 400, error_body("Your request exceeded model token limit: 262144 (requested: 300000)")),
    ("minimax-status-msg", 200, json.dumps({"base_resp": {"status_code": 2013},
        "error": {"status_msg": "invalid params, context window exceeds limit"}})),
    ("anthropic-input-plus-max-tokens", 400, json.dumps({"type": "error", "error": {"type": "invalid_request_error",
        "message": "input length and `max_tokens` exceed context limit: 180000 + 32000 > 200000"}})),
    ("plain-text-400", 400, "prompt is too long"),
    ("uppercase-code-only", 400, json.dumps({"error": {"code": "CONTEXT_LENGTH_EXCEEDED"}})),
    ("token-counts-only", 400, json.dumps({"error": {"n_prompt_tokens": 9000, "n_ctx": 8192}})),
    ("stream-role-delta-then-error", 200, sse(ROLE_ONLY, {"error": {"message": OVERFLOW_MESSAGE}}, "[DONE]")),
    ("stream-first-chunk-window-finish", 200, sse(
        ROLE_ONLY, {"choices": [{"index": 0, "delta": {}, "finish_reason": "model_context_window_exceeded"}]})),
    ("responses-failed-after-lifecycle", 200,
        'event: response.created\ndata: {"type":"response.created"}\n\n'
        'event: response.in_progress\ndata: {"type":"response.in_progress"}\n\n'
        'event: response.failed\ndata: {"type":"response.failed","response":{"error":'
        '{"code":"Context_Length_Exceeded","message":"too big"}}}\n\n'),
    # A response that ends because the window ran out, in its finish (a bridge carries the stop reason over).
    ("responses-incomplete-window", 200, json.dumps({"object": "response", "status": "incomplete", "output": [],
        "incomplete_details": {"reason": "model_context_window_exceeded"}})),
    ("responses-stream-incomplete-window", 200,
        'event: response.created\ndata: {"type":"response.created"}\n\n'
        'event: response.incomplete\ndata: {"type":"response.incomplete","response":{"status":"incomplete",'
        '"incomplete_details":{"reason":"model_context_window_exceeded"},"output":[]}}\n\n'),
    ("crlf-sse-error", 200, sse({"error": {"message": OVERFLOW_MESSAGE}}).replace("\n", "\r\n")),
    ("413-names-the-window", 413, error_body("prompt is too long: 211180 tokens > 200000 maximum")),
    ("invalid-utf8-around-message", 400, b"\xff\xfe" + OVERFLOW_MESSAGE.encode() + b"\x80"),
    ("triple-encoded", 400, json.dumps({"error": {"message": json.dumps({"error": {"message": json.dumps(
        {"message": "The input token count (3475108) exceeds the maximum number of tokens allowed (1048576)."})}})}})),
    ("bedrock-binary-exception-frame", 200, BEDROCK_EXCEPTION_FRAME),
    ("whitespace-400", 400, " \r\n "),
    # Too deep to decode as JSON, so it is read as text, where the phrase still shows.
    ("undecodably-deep-json", 400, '{"error":' * 5_000 + f'"{OVERFLOW_MESSAGE}"' + "}" * 5_000),
    ("bytearray-body", 400, bytearray(error_body(OVERFLOW_MESSAGE).encode())),  # type: ignore[list-item]
]


@pytest.mark.parametrize(("status", "body"), [c[1:] for c in POSITIVES], ids=[c[0] for c in POSITIVES])
def test_own_positive_is_overflow(status: int, body: str | bytes) -> None:
    assert detect_context_overflow(status, body) is True


def test_huge_body_is_judged_on_its_head() -> None:
    padding = "x" * (4 << 20)
    assert detect_context_overflow(400, "prompt is too long" + padding) is True
    assert detect_context_overflow(400, padding + "prompt is too long") is False


@pytest.mark.parametrize("seed", range(40))
def test_hostile_bytes_never_raise(seed: int) -> None:
    rng = random.Random(seed)
    fragments = [b"data:", b"error:", b"event: error\n", b"\n\n", b"{", b"}", b"[", b'"error":', b'"message":',
                 b"\\u003e", b"\xff", b"\xed\xa0\x80", b"context length", b":message-type\x07\x00\x09exception"]
    body = b"".join(rng.choice(fragments) if rng.random() < 0.5 else rng.randbytes(rng.randint(0, 8))
                    for _ in range(rng.randint(0, 400)))
    for status in (200, 400, 413, 429, 500):
        assert isinstance(detect_context_overflow(status, body), bool)
    limit = context_limit_from_error(body)
    assert limit is None or limit > 0


def test_surrogates_in_str_body_do_not_raise() -> None:
    assert detect_context_overflow(400, "\udcff prompt is too long \ud800") is True
    assert context_limit_from_error("\udcff> 4096 maximum") == 4096


CORPUS_LIMITS = [
    ("openai-chat-messages-resulted", 128000), ("openai-chat-requested-breakdown", 4097),
    ("openai-legacy-completions-style", 8192), ("vllm-renderer-you-passed-with-output", 32768),
    ("vllm-max-tokens-too-large-input-fits", 65536), ("vllm-v1-decoder-prompt-stream", 8192),
    ("sglang-input-too-long", 262144), ("sglang-stream-200-error", 131072), ("llamacpp-current", 8192),
    ("llamacpp-current-stream-requested", 32768), ("lmstudio-keep-first-tokens", 4096),
    ("lmstudio-n-keep-greater", 4096), ("tgi-max-total-tokens-422", 8192), ("tgi-stream-200-error", 8192),
    ("together-tgi-style", 32769), ("anthropic-native-prompt-too-long", 200000),
    ("vertex-anthropic-wrapped", 200000), ("gemini-native-generatecontent", 65536),
    ("gemini-openai-compat-array", 1048575), ("gemini-genai-sdk-double-encoded", 1048576),
    ("fireworks-prompt-too-long", 32767), ("openrouter-provider-returned-error", 262144),
    ("bedrock-claude-prompt-too-long", 200000), ("vllm-at-least-lower-bound", 128000),
]


@pytest.mark.parametrize(("entry_id", "limit"), CORPUS_LIMITS, ids=[c[0] for c in CORPUS_LIMITS])
def test_limit_named_by_corpus_entry(entry_id: str, limit: int) -> None:
    text = body_text(CORPUS_BY_ID[entry_id])
    assert context_limit_from_error(text) == limit
    assert context_limit_from_error(text.encode()) == limit


NO_LIMIT_IDS = [
    "openai-responses-stream-response-failed", "llamacpp-old-invalid-request", "llamacpp-old-stream-error-field",
    "groq-context-length", "bedrock-converse-input-too-long", "cerebras-no-body",
    "neg-openai-max-tokens-too-large", "neg-anthropic-max-tokens-output-cap", "neg-openai-request-too-large-tpm",
    "neg-openai-responses-stream-rate-limit", "neg-llamacpp-finish-length",
]


@pytest.mark.parametrize("entry_id", NO_LIMIT_IDS)
def test_corpus_entry_without_a_named_limit(entry_id: str) -> None:
    assert context_limit_from_error(body_text(CORPUS_BY_ID[entry_id])) is None


OWN_LIMITS: list[tuple[str, str | bytes, int | None]] = [
    ("comma-grouped", error_body("This model's maximum context length is 128,000 tokens."), 128000),
    ("mistral", "too large for model with 32768 maximum context length", 32768),
    ("xai", "This model's maximum prompt length is 131072 but the request contains 537812 tokens.", 131072),
    ("copilot", "prompt token count of 140000 exceeds the limit of 128000", 128000),
    ("kimi", "Your request exceeded model token limit: 262144 (requested: 300000)", 262144),
    ("anthropic-sum", "input length and `max_tokens` exceed context limit: 180000 + 32000 > 200000", 200000),
    ("n-ctx-field", '{"error": {"n_prompt_tokens": 5000, "n_ctx": 4096}}', 4096),
    ("zero-window", "This model's maximum context length is 0 tokens.", None),
    ("unrelated-bound", error_body("temperature must be <= 2"), None),
    ("unrelated-size-limit", error_body("Request exceeds the limit of 32 MB"), None),
    ("empty", b"", None),
    ("invalid-utf8", b"\xff\xfe\x80", None),
    ("html", "<html><body>502 Bad Gateway</body></html>", None),
]


@pytest.mark.parametrize(("body", "limit"), [c[1:] for c in OWN_LIMITS], ids=[c[0] for c in OWN_LIMITS])
def test_limit_from_own_bodies(body: str | bytes, limit: int | None) -> None:
    assert context_limit_from_error(body) == limit


# --- the second corpus ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("entry", MORE, ids=[entry["id"] for entry in MORE])
def test_more_entry_is_classified_as_labelled(entry: dict[str, Any]) -> None:
    text = body_text(entry)
    assert detect_context_overflow(entry["status"], text) is entry["is_context_overflow"]
    assert detect_context_overflow(entry["status"], text.encode()) is entry["is_context_overflow"]


def test_more_corpus_is_well_formed_and_new() -> None:
    assert len(MORE) >= 30
    assert {e["is_context_overflow"] for e in MORE} == {True, False}
    assert len(CORPUS_BY_ID) == len(CORPUS) + len(MORE), "ids are unique across both corpora"
    for entry in MORE:
        assert entry.keys() == CORPUS[0].keys(), entry["id"]
        assert entry["source"].strip() and entry["note"].strip(), entry["id"]
    assert len({e["provider"].split(" (")[0] for e in MORE} - {e["provider"].split(" (")[0] for e in CORPUS}) >= 15


@pytest.mark.parametrize("entry", [e for e in MORE if e["status"] == 429], ids=lambda e: e["id"])
def test_quota_lookalike_is_rejected_by_its_words_too(entry: dict[str, Any]) -> None:
    # The 429 shortcut decides these; the grammar must agree when a gateway relabels the status.
    assert detect_context_overflow(400, body_text(entry)) is False


MORE_LIMITS = [
    ("cohere-v1-too-many-tokens", 2048), ("dashscope-compat-range-of-input-length", 983616),
    ("volcengine-ark-input-length-exceeds-maximum", 202752), ("nvidia-nim-vllm-you-passed", 202752),
    ("nvidia-nim-messages-resulted", 196608), ("omlx-prompt-too-long-exceeds-max-context-window", 32768),
    ("lmstudio-old-input-length-exceeds-context-length", 1500), ("tgi-inputs-must-have-less-than", 1024),
    ("tei-inputs-must-have-less-than-413", 512), ("tensorrt-llm-triton-prompt-exceeds-max-sequence-length", 2048),
    ("xai-maximum-prompt-length", 131072), ("copilot-empty-code", 64000), ("kimi-exceeded-model-token-limit", 262144),
    ("siliconflow-prompt-tokens-less-than-max-seq-len", 65536), ("siliconflow-max-total-tokens", 32768),
    ("cerebras-current-length-while-limit", 40000), ("cloudflare-workers-ai-vllm-at-least", 131072),
    ("cloudflare-requested-token-count", 256000), ("textgen-webui-openai-ext-resulted-in-over", 2048),
    ("fastchat-code-40303", 2048), ("gemini-input-token-count-no-count", 1048576),
    ("rix-relay-gemini-input-token-count", 131072), ("github-models-tokens-limit-reached-413", 8000),
]


@pytest.mark.parametrize(("entry_id", "limit"), MORE_LIMITS, ids=[c[0] for c in MORE_LIMITS])
def test_limit_named_by_more_entry(entry_id: str, limit: int) -> None:
    assert context_limit_from_error(body_text(CORPUS_BY_ID[entry_id])) == limit


@pytest.mark.parametrize("entry", [e for e in MORE if not e["is_context_overflow"]], ids=lambda e: e["id"])
def test_lookalike_names_no_window(entry: dict[str, Any]) -> None:
    # An output cap ("max_tokens cannot exceed 8192") or a quota is not the window: nothing to remember.
    assert context_limit_from_error(body_text(entry)) is None


# --- the grammar, piece by piece ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("pattern", "hits", "misses"), [
    (_SUBJECT, ["prompt is too long", "`inputs` tokens", "input token count", "your messages resulted",
                "number of tokens (prompt and prediction)", "too many tokens: size limit exceeded"],
     ["temperature must be <= 2", "request exceeds the maximum size", "max_tokens is too large"]),
    (_COMPARISON, ["exceeds the limit", "cannot exceed 2048", "must have less than 4096", "is greater than the",
                   "must be <= 8192", "211180 tokens > 200000", "(n_keep: 9000 >= n_ctx: 4096)",
                   "range of input length should be [1, 30720]", "size limit exceeded by 11836 tokens",
                   "is longer than the maximum model length", "context length is only 32768"],
     ["this model's maximum context length is 8192 tokens", "<html><h1>413", "please reduce the length"]),
    (_LIMIT, ["maximum number of tokens allowed", "max length", "exceeds the limit of", "should be [1, 30720]"],
     ["max_tokens", "the input length"]),
    (_WINDOW, ["maximum context length", "the context window", "context size", "context_length", "n_ctx: 4096",
               "max_seq_len (65536)", "the maximum model length of 8192", "maximum prompt length"],
     ["context=()", "supplied: context", "max_tokens"]),
    (_OUTPUT, ["max_tokens is too large", "`max_new_tokens` must be", "max_completion_tokens", "4096 completion tokens",
               "the maximum tokens you requested", "maximum allowed number of output tokens"],
     ["max_total_tokens (33802)", "in the completion", "input tokens"]),
])
def test_grammar_piece(pattern: re.Pattern[str], hits: list[str], misses: list[str]) -> None:
    assert [text for text in hits if not pattern.search(text)] == []
    assert [text for text in misses if pattern.search(text)] == []


def test_output_clauses_are_set_aside_but_mixed_ones_stay() -> None:
    message = ("'max_tokens' or 'max_completion_tokens' is too large: 8192. this model's maximum context length is "
               "65536 tokens and your request has 57546 input tokens (8192 > 65536 - 57546). (parameter=max_tokens)")
    kept = _input_text(message)
    assert "too large" not in kept and "parameter=max_tokens" not in kept
    assert "maximum context length is 65536" in kept
    assert "max_new_tokens" in _input_text("input validation error: `inputs` tokens + `max_new_tokens` must be <= 8192")
    assert _input_text("input validation error: `max_new_tokens` must be <= 192").strip() == ""


@pytest.mark.parametrize(("message", "verdict"), [
    # The brief's pair: an input-side window refusal, and an output-limit look-alike naming a maximum.
    ("This model's maximum context length is 8192 tokens. However, you requested 9000 tokens", True),
    ("max_tokens is too large: 10000. This model supports at most 4096 completion tokens", False),
    ("prompt is too long", True),
    ("Please reduce the length of the messages.", True),
    ("Prompt exceeds max length", True),
    ("Context size has been exceeded.", True),
    ("too many tokens: size limit exceeded by 11836 tokens. Try using shorter or fewer inputs", True),
    ("Your request exceeded model token limit: 131072", True),
    ("Request body too large for gpt-4o model. Max size: 8000 tokens.", True),
    ("`inputs` tokens + `max_new_tokens` must be <= 4096. Given: 4000 `inputs` tokens and 512 `max_new_tokens`", True),
    ("max_tokens: 70000 > 64000, which is the maximum allowed number of output tokens", False),
    ("Invalid max_tokens value, the valid range of max_tokens is [1, 8192]", False),
    ("Range of max_tokens should be [1, 8192]", False),
    ("Request exceeds the limit of 32 MB", False),
    ("Invalid input: temperature must be <= 2", False),
    ("the maximum context length is 8192 tokens", False),  # names the window but compares nothing
    ("This model's maximum context length is 8192 tokens. However, you requested 8000 tokens", False),
])
def test_message_grammar(message: str, verdict: bool) -> None:
    assert _message_says_overflow(message.lower()) is verdict


@pytest.mark.parametrize(("message", "counts"), [
    ("this model's maximum context length is 8192 tokens. however, you requested 9000 tokens", (9000, 8192)),
    ("this endpoint's maximum context length is 16,384 tokens. however, you requested about 94,307 tokens",
     (94307, 16384)),
    (("you requested 65535 output tokens and your prompt contains at least 62466 input tokens, for a total of at "
      "least 128001 tokens. this model's maximum context length is 128000 tokens"), (128001, 128000)),
    ("please reduce the length of the messages or completion. current length is 42328 while limit is 40000",
     (42328, 40000)),
    ("this model's maximum prompt length is 131072 but the request contains 136973 tokens.", (136973, 131072)),
    ("your request exceeded model token limit: 262144 (requested: 269030)", (269030, 262144)),
    ("prompt is too long", (None, None)),
    # The output clause is not read: its numbers are the output budget, not the window.
    ("max_tokens is too large: 6000. this model supports at most 4096 completion tokens", (None, None)),
])
def test_numbers_read_from_the_text(message: str, counts: tuple[int | None, int | None]) -> None:
    assert _requested_and_limit(message) == counts


NEW_STYLE_LIMITS: list[tuple[str, str, int | None]] = [
    ("openai", error_body("This model's maximum context length is 8192 tokens."), 8192),
    ("llamacpp-lmstudio", "(n_keep: 9000 >= n_ctx: 4096)", 4096),
    ("dashscope-range", "Range of input length should be [1, 30720]", 30720),
    ("tgi-total", json.dumps({"error": "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. "
                                       "Given: 4000 `inputs` tokens and 512 `max_new_tokens`"}), 4096),
    ("tgi-input", json.dumps({"error": "Input validation error: `inputs` must have less than 1024 tokens. "
                                       "Given: 1062"}), 1024),
    ("cohere", "total number of tokens (prompt and prediction) cannot exceed 2048 - received 6354", 2048),
    ("sum-form", "input length and `max_tokens` exceed context limit: 180000 + 32000 > 200000", 200000),
    ("bytes-are-not-tokens", "Request payload exceeds the limit: 20971520 bytes", None),
    ("characters-are-not-tokens", "`inputs` must have less than 32000 characters. Given: 67337", None),
    ("output-cap", "max_tokens (10000) cannot exceed 8192. Please reduce the length of max output tokens", None),
    ("quota", "Request too large on tokens per min (TPM): Limit 30000, Requested 342389.", None),
]


@pytest.mark.parametrize(("body", "limit"), [c[1:] for c in NEW_STYLE_LIMITS], ids=[c[0] for c in NEW_STYLE_LIMITS])
def test_limit_from_new_styles(body: str, limit: int | None) -> None:
    assert context_limit_from_error(body) == limit


# --- properties -----------------------------------------------------------------------------------------------------

OVERFLOW_WORDS = st.sampled_from([
    "prompt", "input", "messages", "tokens", "exceeds", "maximum context length", "is too long", "n_ctx: ", "> ",
    "must be <= ", "[1, ", "max_tokens", "limit", "tokens per min", "data: ", '{"error": ', '"message": "', "}", "\n",
    "8192", "9,000", "\udcff", "\u003e",
])
BODIES = st.one_of(
    st.binary(max_size=3000),
    st.text(max_size=3000),
    st.lists(st.one_of(OVERFLOW_WORDS, st.text(max_size=20)), max_size=80).map("".join),
)


@settings(max_examples=300, deadline=None)
@given(status=st.sampled_from([200, 400, 413, 422, 429, 500, 503]), body=BODIES)
def test_any_body_gives_a_bool_and_never_raises(status: int, body: str | bytes) -> None:
    assert isinstance(detect_context_overflow(status, body), bool)
    limit = context_limit_from_error(body)
    assert limit is None or (isinstance(limit, int) and limit > 0)


@pytest.mark.parametrize("body", [
    "This model's maximum context length is " + "9" * 60_000 + " tokens. However, you requested 9000 tokens",
    "limit " + "1," * 30_000, "prompt exceeds limit of " * 3_000, " > 1" * 20_000, "max_tokens is too large. " * 3_000,
], ids=["huge-number", "comma-run", "repeated-phrase", "repeated-comparison", "many-output-clauses"])
def test_pathological_texts_are_cheap_and_safe(body: str) -> None:
    started = time.perf_counter()
    assert isinstance(detect_context_overflow(400, body), bool)
    limit = context_limit_from_error(body)
    assert limit is None or 0 < limit < 10**15
    assert time.perf_counter() - started < 0.5


@settings(max_examples=100, deadline=None)
@given(body=BODIES)
def test_quota_statuses_and_finish_length_are_never_overflows(body: str | bytes) -> None:
    assert detect_context_overflow(429, body) is False
    assert detect_context_overflow(200, completion(str(body)[:200], "length")) is False
