"""Where the learners' shared base lives in RAM-backed storage, and how it is released (``learners.shared_base``
writes and maps it). No torch here: a node's cleanup task (``actors.node_cleanup``) imports this in a bare Ray
worker, which would otherwise spend seconds importing torch at the end of every run."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any


SHM_DIR_ENV = "POPULORA_SHM_DIR"
"""The environment variable that names another RAM-backed directory for our files (a container whose /dev/shm is
small, or two runs kept apart on one machine); the actors inherit it from the process that starts the cluster."""


def default_shm_dir() -> Path:
    """Where the shared base and the adapter stores go: ``$POPULORA_SHM_DIR`` where set (it must be a directory),
    else ``/dev/shm`` where it exists (Linux), else the temp dir."""
    chosen = os.environ.get(SHM_DIR_ENV, "").strip()
    if chosen:
        if not Path(chosen).is_dir():
            raise FileNotFoundError(f"{SHM_DIR_ENV}={chosen} is not a directory (create it, or unset the variable "
                                    "to use /dev/shm)")
        return Path(chosen)
    return Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())


def dtype_name(dtype: Any) -> str:
    """``"torch.float32"`` for ``torch.float32`` or ``"float32"`` (a config's dtype), ``"None"`` for None: the
    spelling the base's name hashes, the same with or without torch imported."""
    name = str(dtype)
    return name if dtype is None or name.startswith("torch.") else f"torch.{name}"


def _base_key(model_dir: Path, dtype: Any) -> str:
    files = sorted(p for p in model_dir.iterdir() if p.suffix in (".safetensors", ".bin", ".json"))
    stamp = "|".join(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files)
    return hashlib.sha256(f"{model_dir.resolve()}|{stamp}|{dtype_name(dtype)}".encode()).hexdigest()[:16]


def base_dir_for(model_dir: str | os.PathLike, dtype: Any = None, shm_dir: str | os.PathLike | None = None) -> Path:
    """Where :func:`learners.shared_base.materialise_base` puts this machine's copy of ``model_dir`` in ``dtype``
    (a torch dtype or its name; written or not): a name derived from the model directory as this machine sees it,
    so each node of a cluster finds its own."""
    root = Path(shm_dir) if shm_dir is not None else default_shm_dir()
    return root / f"populora-base-{_base_key(Path(model_dir), dtype)}"


def release_base(base_dir: str | os.PathLike) -> None:
    """Delete a shared base directory and its lock file, freeing its RAM once no process maps it any more.

    Call it when the run ends: a materialised base otherwise stays in ``/dev/shm`` (by design, so later
    learners on the machine reuse it). Processes that mapped it keep working (their mappings hold the pages).
    """
    path = Path(base_dir)
    shutil.rmtree(path, ignore_errors=True)
    (path.parent / f".{path.name}.lock").unlink(missing_ok=True)
