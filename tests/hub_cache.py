"""A local Hugging Face cache built on disk, as ``hf download`` leaves it, for the tests of ``model.path`` by Hub id.

Layout (huggingface_hub's): ``CACHE/models--<org>--<name>/blobs/<sha256>`` holds each file once,
``snapshots/<commit>/<file>`` links to its blob and ``refs/main`` names the commit. Nothing is downloaded: the files
are the tiny test model's.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def tiny_model_dir() -> Path:
    """The tiny test model's directory (shipped with the code, or built once and cached)."""
    from tinycoder import ensure_model

    return Path(ensure_model("test", progress=False))


def add_to_cache(cache: Path, repo_id: str, model_dir: Path, files: list[str] | None = None) -> Path:
    """Put ``model_dir``'s files (only ``files`` when given) into the cache ``cache`` as ``repo_id`` at ``COMMIT``;
    returns the snapshot directory."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / COMMIT
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    for source in sorted(model_dir.iterdir()):
        if not source.is_file() or (files is not None and source.name not in files):
            continue
        blob = repo / "blobs" / hashlib.sha256(source.read_bytes()).hexdigest()
        shutil.copyfile(source, blob)
        os.symlink(os.path.relpath(blob, snapshot), snapshot / source.name)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(COMMIT)
    return snapshot


def cache_env(cache: Path) -> dict[str, str]:
    """The environment that points huggingface_hub at ``cache``, offline."""
    return {"HF_HUB_CACHE": str(cache), "HF_HOME": str(cache.parent / "hf-home"), "HF_HUB_OFFLINE": "1"}
