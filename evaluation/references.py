"""Reference outputs and per-input reference times of evalplus-layout tasks, cached by file hash.

evalplus computes each task's expected outputs and the reference's wall time per input once per
dataset and caches them under its cache directory keyed by the dataset's hash (``get_groundtruth``);
so does this module: one JSON file per benchmark file,
``$XDG_CACHE_HOME/populora/evaluation/references/<sha256 of the file>.json`` (``~/.cache`` when the
variable is unset), holding per task id the reprs of the base and plus outputs and their times, or
the reason the reference failed (a *data error* of that task only). Tasks are added as they are
first measured (``--limit`` measures only the tasks it evaluates). The file's hash is taken over its
bytes as stored (``.jsonl.gz`` compressed), so an edited file is measured again.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

CACHE_FORMAT = 2  # bump when what is measured changes; older files are ignored (2: outputs made plain, _ep_plain)


@dataclass(frozen=True)
class Reference:
    """One task's reference run: outputs as Python source (reprs), seconds per input; or ``error``."""

    expected_base: str = "[]"
    expected_plus: str = "[]"
    time_base: tuple[float, ...] = ()
    time_plus: tuple[float, ...] = ()
    error: str | None = None


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/populora/evaluation`` (default ``~/.cache/populora/evaluation``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "populora" / "evaluation"


def file_digest(path: Path) -> str:
    """sha256 of the file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class ReferenceCache:
    """Reads and extends the cached references of benchmark files (``root``: the cache directory)."""

    def __init__(self, root: Path | None = None):
        self.root = (root or cache_root()) / "references"
        self._loaded: dict[str, dict[str, Reference]] = {}

    def path(self, digest: str) -> Path:
        return self.root / f"{digest}.json"

    def get(self, digest: str) -> dict[str, Reference]:
        """Every cached task of the file with this digest (empty when none, or unreadable)."""
        if digest not in self._loaded:
            tasks: dict[str, Reference] = {}
            try:
                data = json.loads(self.path(digest).read_text())
                if data.get("format") == CACHE_FORMAT:
                    for task_id, item in data["tasks"].items():
                        tasks[task_id] = Reference(item["expected_base"], item["expected_plus"], tuple(item["time_base"]),
                                                   tuple(item["time_plus"]), item.get("error"))
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                tasks = {}
            self._loaded[digest] = tasks
        return self._loaded[digest]

    def add(self, digest: str, new: dict[str, Reference]) -> None:
        """Store newly measured tasks of a file (written atomically: a temp file, then rename)."""
        tasks = self.get(digest)
        tasks.update(new)
        self.root.mkdir(parents=True, exist_ok=True)
        target = self.path(digest)
        tmp = target.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({"format": CACHE_FORMAT, "tasks": {k: asdict(v) for k, v in tasks.items()}}))
        os.replace(tmp, target)
