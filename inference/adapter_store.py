"""The engine's own versioned copies of adapter directories.

A learner publishes a new adapter version as a PEFT directory (``adapter_config.json`` +
``adapter_model.safetensors``). The engine copies it into a fresh directory of its own,
``<root>/<name>/v<version>-<seq>``, on a RAM-backed file system where there is one
(``/dev/shm``), or takes it over by a rename when the caller hands it over (the inference actor writes
the files it receives into a directory on that same file system). A new path per version matters to vLLM: its prefix cache is keyed by
``(name, path)``, and it re-reads an evicted adapter from its path, so a path must never change
contents while a request may still use it. Engine calls are serialized, so when a version is
replaced no request can still reference the old directory and it is deleted at once.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from typing_extensions import Buffer

from inference.requests import AdapterLoadError
from learners.shared_base_paths import default_shm_dir


@dataclass(frozen=True)
class AdapterSpec:
    """What an engine needs to know about an adapter directory before loading it."""

    rank: int
    alpha: float
    target_modules: tuple[str, ...]
    use_rslora: bool

    @property
    def scaling(self) -> float:
        """s = alpha / r, or alpha / sqrt(r) with rsLoRA (PEFT's convention)."""
        return self.alpha / (self.rank**0.5 if self.use_rslora else self.rank)


def read_adapter_spec(path: Path, max_rank: int) -> AdapterSpec:
    """Check that ``path`` is a loadable PEFT LoRA directory of rank <= ``max_rank``."""
    from learners.peft_io import WEIGHTS_NAME, read_adapter_config  # torch and peft: not in the driver's imports

    if not path.is_dir():
        raise AdapterLoadError(f"adapter path {path} is not a directory")
    try:
        config = read_adapter_config(path)
    except (ValueError, FileNotFoundError) as err:  # JSONDecodeError is a ValueError
        raise AdapterLoadError(f"adapter {path}: {err}") from err
    if not (path / WEIGHTS_NAME).is_file():
        raise AdapterLoadError(f"adapter directory {path} has no {WEIGHTS_NAME}")
    rank = config.get("r")
    if not isinstance(rank, int) or rank < 1:
        raise AdapterLoadError(f"adapter {path}: rank r={rank!r} is not a positive integer")
    if rank > max_rank:
        raise AdapterLoadError(f"adapter {path}: rank {rank} exceeds the engine's max_lora_rank {max_rank}")
    targets = config.get("target_modules") or []
    if isinstance(targets, str):
        raise AdapterLoadError(f"adapter {path}: target_modules must be a list of module names, got a regex {targets!r}")
    return AdapterSpec(
        rank=rank,
        alpha=float(config.get("lora_alpha", rank)),
        target_modules=tuple(sorted(targets)),
        use_rslora=bool(config.get("use_rslora", False)),
    )


def write_adapter_dir(files: Mapping[str, Buffer], directory: Path) -> Path:
    """Write a PEFT directory's files (file name -> bytes, or any buffer such as the read-only numpy view
    of an object-store payload) into ``directory`` (created). Returns it."""
    directory.mkdir(parents=True, exist_ok=True)
    for filename, data in files.items():
        if "/" in filename or filename in ("", ".", ".."):
            raise AdapterLoadError(f"adapter file name {filename!r} is not a plain file name")
        (directory / filename).write_bytes(data)
    return directory


def ram_backed_root() -> Path:
    """``learners.shared_base_paths.default_shm_dir`` (``$POPULORA_SHM_DIR``, else ``/dev/shm``) where it is
    writable, else the system temp directory."""
    shm = default_shm_dir()
    try:
        with tempfile.TemporaryFile(dir=shm):
            return shm
    except OSError:
        return Path(tempfile.gettempdir())


class AdapterStore:
    """Versioned adapter directories owned by one engine, removed when the engine closes."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="populora-adapters-", dir=root or ram_backed_root()))
        self._seq = itertools.count()
        self._finalizer = weakref.finalize(self, shutil.rmtree, self.root, True)

    def publish(self, name: str, source: Path, version: int, move: bool = False) -> Path:
        """Copy ``source`` into a new directory for ``(name, version)`` and return its path.

        ``move``: the caller hands ``source`` over; it is renamed into the store (no copy when both are on
        one file system, as the inference actor's incoming directory and the store are).
        """
        target = self.root / name / f"v{version}-{next(self._seq)}"
        target.parent.mkdir(parents=True, exist_ok=True)
        if move:
            shutil.move(source, target)
        else:
            shutil.copytree(source, target)
        return target

    def discard(self, path: Path) -> None:
        """Delete a version no request can reference any more."""
        shutil.rmtree(path, ignore_errors=True)

    def live_versions(self) -> list[Path]:
        """Version directories still on disk."""
        return sorted(p for p in self.root.glob("*/v*") if p.is_dir())

    def close(self) -> None:
        self._finalizer()
