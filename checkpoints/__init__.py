"""Checkpoint files and their integrity checks (pure, no Ray): ``RUN_DIR/checkpoints/``.

Layout::

    RUN_DIR/checkpoints/step-N/    one complete checkpoint per N (written as .tmp-step-N, then renamed)
    RUN_DIR/checkpoints/latest     name of the newest complete checkpoint (replaced atomically)

A checkpoint directory appears under its final name only after every file in it is written and
synced, and ``latest`` moves only after that, so the latest checkpoint is always complete even if
the run is killed mid-write. Each checkpoint ends with ``manifest.json`` (written last): the size
and SHA-256 of every other file. ``find_checkpoint`` checks it and falls back to the checkpoint
before a damaged one (a file truncated or changed after the fact), saying why. Retention
(``checkpoints_to_delete``) keeps the newest ``run.keep_checkpoints`` (default 2) of the run's checkpoints at or
before the one ``latest`` names, never that one, and leaves any after it (a damaged one a resume skipped, which the
run writes again when it gets there). The disk filling up while a checkpoint is written raises
``CheckpointWriteError`` with the previous checkpoint kept and the partial one removed.

The driver is not the only writer of a checkpoint: each learner writes its own files
(``learners/<i>/``) straight into the temporary directory, so adapter and optimizer state never pass
through the driver. The driver first writes a random token into ``.checkpoint-id``; a learner checks
that it reads the same token before it writes or restores (``check_checkpoint_dir``), which fails
clearly where a learner's node does not share the run directory's file system.

``CheckpointStore`` is the checkpoint half of a run directory (``reporting.run_dir.RunDirectory`` adds the
run's records to it).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import secrets
import shutil
import socket
from pathlib import Path
from typing import Any, Callable

CHECKPOINT_ID = ".checkpoint-id"
MANIFEST = "manifest.json"


class CheckpointDirectoryError(RuntimeError):
    """A process cannot see the checkpoint directory the driver made (no shared file system)."""


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written (the disk is full); the previous one is kept."""


def file_digest(path: Path) -> dict[str, Any]:
    """``{"size", "sha256"}`` of one file: a checkpoint manifest entry (each writer hashes its own files)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return {"size": Path(path).stat().st_size, "sha256": digest.hexdigest()}


def tree_digests(root: Path) -> dict[str, dict[str, Any]]:
    """Manifest entries of every file under ``root``, by path relative to it."""
    return {p.relative_to(root).as_posix(): file_digest(p) for p in sorted(Path(root).rglob("*")) if p.is_file()}


def checkpoint_problem(directory: Path) -> str | None:
    """Why the checkpoint ``directory`` cannot be trusted (its manifest missing, a file missing, truncated or
    changed), or None when every file matches its manifest entry."""
    manifest = Path(directory) / MANIFEST
    if not manifest.is_file():
        return f"it has no {MANIFEST} (cut short, or written by an older version)"
    try:
        entries = json.loads(manifest.read_text())["files"]
    except (ValueError, KeyError) as exc:
        return f"its {MANIFEST} is unreadable ({exc})"
    for name, want in sorted(entries.items()):
        path = Path(directory) / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != want["size"]:
            return f"{name} has {path.stat().st_size} bytes, its manifest says {want['size']} (truncated?)"
        if file_digest(path)["sha256"] != want["sha256"]:
            return f"{name} does not match its checksum in the manifest"
    return None


def disk_full(exc: BaseException) -> OSError | None:
    """The ENOSPC/EDQUOT error behind ``exc`` (raised here, or in an actor: Ray wraps it), else None."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in (errno.ENOSPC, errno.EDQUOT):
            return current
        if "No space left on device" in str(current) or "Disk quota exceeded" in str(current):
            return current if isinstance(current, OSError) else OSError(errno.ENOSPC, str(current).splitlines()[-1])
        current = getattr(current, "cause", None) or current.__cause__
    return None


def fsync_tree(path: Path) -> None:
    """Flush every file under ``path`` to stable storage (from the process that wrote it, where the file
    system is shared between nodes)."""
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        with open(file, "rb") as handle:
            os.fsync(handle.fileno())


def mark_checkpoint_dir(directory: Path) -> str:
    """Write a fresh random token into ``directory/.checkpoint-id`` and return it."""
    token = secrets.token_hex(16)
    write_atomic(directory / CHECKPOINT_ID, token)
    return token


def read_checkpoint_token(directory: Path) -> str:
    """The token ``mark_checkpoint_dir`` wrote into a checkpoint (checked again by each learner on restore)."""
    marker = Path(directory) / CHECKPOINT_ID
    if not marker.is_file():
        raise CheckpointDirectoryError(
            f"{directory} has no {CHECKPOINT_ID}: it is not a checkpoint written by this version (learners "
            "write their own files since the adapter-transport change; older checkpoints cannot be resumed)"
        )
    return marker.read_text().strip()


def check_checkpoint_dir(directory: Path, token: str, who: str) -> None:
    """Raise ``CheckpointDirectoryError`` unless this process reads ``token`` in ``directory/.checkpoint-id``,
    i.e. sees the very directory the driver made; ``who`` names the caller in the message."""
    marker = Path(directory) / CHECKPOINT_ID
    try:
        seen = marker.read_text().strip()
    except OSError:
        seen = None
    if seen != token:
        what = "does not exist" if seen is None else "holds another checkpoint's token"
        raise CheckpointDirectoryError(
            f"{who} on host {socket.gethostname()} cannot see the checkpoint directory {directory} that the driver "
            f"made ({marker} {what} here). Learners write their checkpoint files themselves: on more than one node "
            "the run directory (run.run_dir) must be on a file system every node mounts at the same path "
            "(NFS, a cloud file store)."
        )


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` in one step (written beside it, synced, renamed over it)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    with open(tmp, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def checkpoint_step(checkpoint: Path | str) -> int | None:
    """N of a checkpoint directory named ``step-N``; None for any other name (``.tmp-step-N``, ``latest``, a stray
    file)."""
    prefix, _, number = Path(checkpoint).name.partition("-")
    return int(number) if prefix == "step" and number.isdigit() else None


def checkpoints_to_delete(steps: list[int], latest: int, keep: int) -> list[int]:
    """The checkpoint steps retention removes once ``step-<latest>`` is the latest: of the run's checkpoints at or
    before ``latest`` all but the newest ``keep`` (``latest`` itself never: it is the newest of them); steps after
    ``latest`` are left alone (they are not part of the run ``latest`` continues: a damaged checkpoint a resume
    skipped, written again when the run gets there). Pure: the caller deletes."""
    if keep < 1:
        raise ValueError(f"keep must be at least 1 (run.keep_checkpoints), got {keep}")
    candidates = sorted({s for s in steps if s <= latest} | {latest})
    return [s for s in candidates[:-keep] if s != latest]


class CheckpointStore:
    """``ROOT/checkpoints/``: atomic ``step-N`` directories, the ``latest`` pointer, the newest ``keep`` kept."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.checkpoints = self.root / "checkpoints"

    def save_checkpoint(self, step: int, write: Callable[[Path], dict[str, dict[str, Any]] | None], keep: int = 2) -> Path:
        """Call ``write(tmp_dir)`` to fill a checkpoint, then publish it as ``step-<step>`` atomically, and keep the
        newest ``keep`` checkpoints of the run (``checkpoints_to_delete``; ``run.keep_checkpoints``).

        ``write`` returns the manifest entries of what it wrote (``tree_digests``; writers on other nodes hash
        their own files); anything else has every file hashed here. ``manifest.json`` is written last. When the
        disk fills up the partial copy is removed and ``CheckpointWriteError`` says what to do; the previous
        checkpoint stays the latest.
        """
        final = self.checkpoints / f"step-{step}"
        tmp = self.checkpoints / f".tmp-step-{step}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            tmp.mkdir(parents=True)
            entries = write(tmp)
            entries = entries if isinstance(entries, dict) else tree_digests(tmp)
            fsync_tree(tmp)
            write_atomic(tmp / MANIFEST, json.dumps({"step": step, "files": entries}, sort_keys=True))
        except BaseException as exc:
            full = disk_full(exc)
            if full is None:
                raise
            shutil.rmtree(tmp, ignore_errors=True)
            previous = self.latest_checkpoint_name()
            raise CheckpointWriteError(
                f"the disk is full: checkpoint step-{step} could not be written under {self.checkpoints} "
                f"({full.strerror or full}); the partial copy was removed and "
                f"{'the previous checkpoint ' + previous + ' is kept' if previous else 'no earlier checkpoint exists'}. "
                f"Free space there (or set run.run_dir on a larger disk), then continue with: "
                f"python launch.py --resume {self.root}"
            ) from exc
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        write_atomic(self.checkpoints / "latest", final.name)
        for old in checkpoints_to_delete([checkpoint_step(p) for p in self._step_dirs()], step, keep):
            shutil.rmtree(self.checkpoints / f"step-{old}", ignore_errors=True)
        return final

    def _step_dirs(self) -> list[Path]:
        """The ``step-N`` checkpoint directories, by N."""
        return sorted((p for p in self.checkpoints.glob("step-*") if p.is_dir() and checkpoint_step(p) is not None),
                      key=checkpoint_step)

    def latest_checkpoint_name(self) -> str | None:
        pointer = self.checkpoints / "latest"
        return pointer.read_text().strip() if pointer.is_file() else None

    def find_checkpoint(self) -> tuple[Path | None, list[str]]:
        """The newest checkpoint (at or before ``latest``) whose files match its manifest, and a message for
        each damaged one skipped on the way."""
        name = self.latest_checkpoint_name()
        if name is None:
            return None, []
        newest = checkpoint_step(name)
        if newest is None:
            return None, [f"checkpoints/latest names {name!r}, not a step-N checkpoint"]
        notes = []
        for path in reversed([p for p in self._step_dirs() if checkpoint_step(p) <= newest]):
            problem = checkpoint_problem(path)
            if problem is None:
                return path, notes
            notes.append(f"checkpoint {path.name} is damaged ({problem}); using the one before it")
        return None, notes

    def latest_checkpoint(self) -> Path | None:
        """The newest undamaged checkpoint (``find_checkpoint`` without its messages)."""
        return self.find_checkpoint()[0]

    def final_adapters(self, roles: tuple[str, ...] = ("student", "agent")) -> dict[str, Path]:
        """Member id -> PEFT adapter directory of every member whose role (``league.json``) is in ``roles``, in the
        newest undamaged checkpoint (empty without one)."""
        checkpoint = self.latest_checkpoint()
        if checkpoint is None:
            return {}
        league = json.loads((checkpoint / "league.json").read_text())
        wanted = {member for member, role in league["roles"].items() if role in roles}
        return {p.parent.name: p.parent for p in sorted(checkpoint.glob("learners/*/adapters/*/adapter_config.json"))
                if p.parent.name in wanted}
