"""Where built models live, and how a build is made safe for concurrent callers.

A model directory is ``<cache root>/<variant>-<key>``; the cache root is
``$XDG_CACHE_HOME/populora/tiny-coder`` (``~/.cache/populora/tiny-coder`` when unset). The key
hashes the generator version, the build settings, the seed and a fingerprint of the verifier's
prompt formats, so a change to any of them builds a new model instead of reusing a stale one.

A build runs in a temporary directory beside the target and is renamed into place only when it
is complete (``rename`` is atomic on one file system), under an exclusive ``flock`` on
``<variant>-<key>.lock``: a second process waits for the first and then reuses its result, and
a crashed build leaves no half-written model (the kernel drops the lock with the process). The temporary
directories of builds killed outright (SIGKILL, power loss) are removed by the next build under the lock, as are the
``leftovers`` a caller names (a build's saved progress, ``tinycoder.progress``) once the model is in place.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

MANIFEST = "tinycoder.json"


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/populora/tiny-coder``, or ``~/.cache/populora/tiny-coder``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "populora" / "tiny-coder"


def cache_key(description: dict[str, Any]) -> str:
    """A short stable hash of a JSON-able description (sorted keys, so dict order does not matter)."""
    text = json.dumps(description, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def is_complete(path: Path) -> bool:
    """A model directory is complete once its manifest (written last) is there."""
    return (path / MANIFEST).is_file()


def build_once(root: Path, name: str, build: Callable[[Path], None], leftovers: Sequence[Path] = ()) -> Path:
    """``root/name``, calling ``build(tmp_dir)`` to create it unless it already exists.

    ``build`` must write the manifest last. Concurrent callers serialise on a lock file; whoever
    comes second finds the finished directory and returns it. ``leftovers``: paths removed under the
    lock once the model is in place (also when an earlier caller put it there).
    """
    target = root / name
    if is_complete(target) and not any(p.exists() for p in leftovers):
        return target
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if is_complete(target):
                _remove(leftovers)
                return target
            for stale in root.glob(f".{name}.building-*"):  # only builds under this lock write these: dead ones
                shutil.rmtree(stale, ignore_errors=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{name}.building-", dir=root))
            try:
                build(tmp)
                if not is_complete(tmp):
                    raise RuntimeError(f"the build of {name} finished without writing {MANIFEST}")
                if target.exists():  # an incomplete leftover from an older, interrupted layout
                    shutil.rmtree(target)
                os.rename(tmp, target)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            _remove(leftovers)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return target


def _remove(paths: Sequence[Path]) -> None:
    for path in paths:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
