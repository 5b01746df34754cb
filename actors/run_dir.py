"""A run's directory: resolved config, metrics.jsonl, TensorBoard events, atomic checkpoints.

Layout::

    RUN_DIR/config.yaml            the resolved configuration
    RUN_DIR/metrics.jsonl          one JSON object per step
    RUN_DIR/samples.jsonl          a few raw proposals and answers per step, with the verifier's verdicts
    RUN_DIR/tensorboard/           TensorBoard event files
    RUN_DIR/checkpoints/step-N/    one complete checkpoint per N (written as .tmp-step-N, then renamed)
    RUN_DIR/checkpoints/latest     name of the newest complete checkpoint (replaced atomically)
    RUN_DIR/status.json            why the run stopped: running / finished / interrupted / failed, the cause,
                                   the recoveries, the last step (``running`` after a kill: nobody wrote it)
    RUN_DIR/logs/driver.log        the driver's log records (INFO and up; DEBUG with --verbose)
    RUN_DIR/logs/<actor>.log       each actor's stdout, stderr and log records (``route_output``), one file per
                                   actor name, appended to by a restarted actor

A checkpoint directory appears under its final name only after every file in it is written and
synced, and ``latest`` moves only after that, so the latest checkpoint is always complete even if
the run is killed mid-write. Each checkpoint ends with ``manifest.json`` (written last): the size
and SHA-256 of every other file. ``find_checkpoint`` checks it and falls back to the checkpoint
before a damaged one (a file truncated or changed after the fact), saying why; the two newest
checkpoints are kept. The disk filling up while a checkpoint is written raises
``CheckpointWriteError`` with the previous checkpoint kept and the partial one removed.

``metrics.jsonl`` holds one row per step and, between them, event records (``{"event": "recovery",
...}``) that are not steps: ``read_metrics`` returns the steps, ``read_events`` the events.

The driver is not the only writer of a checkpoint: each learner writes its own files
(``learners/<i>/``) straight into the temporary directory, so adapter and optimizer state never pass
through the driver. The driver first writes a random token into ``.checkpoint-id``; a learner checks
that it reads the same token before it writes or restores (``check_checkpoint_dir``), which fails
clearly where a learner's node does not share the run directory's file system.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import secrets
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import Any, Callable

from configs import Config, dump_config


CHECKPOINT_ID = ".checkpoint-id"
MANIFEST = "manifest.json"
LOG_DIR_ENV = "POPULORA_LOG_DIR"
"""Set by the driver in the actors' environment (``actors.cluster.connect``): where ``route_output`` writes."""
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


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
    _write_atomic(directory / CHECKPOINT_ID, token)
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


def route_output(name: str) -> Path | None:
    """Send this process's output to ``$POPULORA_LOG_DIR/<name>.log`` and return that file.

    File descriptors 1 and 2 are pointed at the file (``dup2``), so prints, tqdm bars, C libraries and child
    processes (the verifier's fork server, vLLM's engine process) all land there, and the root logger writes
    INFO records to it. Nothing happens (None) where the variable is unset (``launch.py --verbose``: Ray
    forwards the output to the terminal) or the directory cannot be written on this node; the output then
    stays in Ray's own worker log files (``/tmp/ray/session_latest/logs/worker-*``).
    """
    directory = os.environ.get(LOG_DIR_ENV)
    if not directory:
        return None
    path = Path(directory) / f"{name}.log"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError:
        return None
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.write(2, f"--- {name}: pid {os.getpid()} on {socket.gethostname()} started {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(min(root.level or logging.INFO, logging.INFO))
    return path


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    with open(tmp, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(tmp, path)


class RunDirectory:
    """Owns every file of one run (the driver is its only writer)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.checkpoints = self.root / "checkpoints"
        self.metrics_path = self.root / "metrics.jsonl"
        self.logs = self.root / "logs"
        self._tensorboard = None

    def create(self, config: Config) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.checkpoints.mkdir(exist_ok=True)
        _write_atomic(self.root / "config.yaml", dump_config(config))

    # status ------------------------------------------------------------------------------------
    @property
    def status_path(self) -> Path:
        return self.root / "status.json"

    def read_status(self) -> dict[str, Any] | None:
        """The last recorded status, or None where the run never wrote one."""
        try:
            return json.loads(self.status_path.read_text())
        except (OSError, ValueError):
            return None

    def write_status(self, state: str, last_step: int, recoveries: int, cause: str | None = None) -> None:
        """Record why the run stopped (or that it runs): ``state`` is running, finished, interrupted or failed."""
        _write_atomic(self.status_path, json.dumps({
            "state": state, "last_step": last_step, "recoveries": recoveries, "cause": cause,
            "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }))

    @staticmethod
    def describe_status(status: dict[str, Any] | None) -> str:
        """One sentence on how the previous session of the run ended."""
        if status is None:
            return "it recorded no status (written by an older version)"
        recovered = f", after recovering {status['recoveries']} time(s)" if status.get("recoveries") else ""
        if status["state"] == "running":
            return (f"its driver stopped without recording why (killed, or the machine went down) after step "
                    f"{status['last_step']}{recovered}")
        cause = f": {status['cause']}" if status.get("cause") else ""
        return f"it {status['state']} at step {status['last_step']}{recovered}{cause}"

    # metrics -----------------------------------------------------------------------------------
    def _records(self) -> list[dict[str, Any]]:
        if not self.metrics_path.is_file():
            return []
        rows = []
        for line in self.metrics_path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                break  # a line cut by a kill mid-write ends the log
        return rows

    def read_metrics(self) -> list[dict[str, Any]]:
        """The step rows, in order."""
        return [r for r in self._records() if "step" in r]

    def read_events(self) -> list[dict[str, Any]]:
        """The event records (recoveries), in order."""
        return [r for r in self._records() if "event" in r]

    def truncate_metrics(self, last_step: int) -> None:
        """Keep the rows up to ``last_step`` and every event (a resumed or recovered run repeats the steps after
        its checkpoint); samples.jsonl likewise."""
        rows = [r for r in self._records() if r.get("step", 0) <= last_step]
        _write_atomic(self.metrics_path, "".join(json.dumps(r) + "\n" for r in rows))
        samples = self.root / "samples.jsonl"
        if samples.is_file():
            kept = [line for line in samples.read_text().splitlines(keepends=True)
                    if line.endswith("\n") and json.loads(line).get("step", 0) <= last_step]
            _write_atomic(samples, "".join(kept))

    def append_event(self, record: dict[str, Any]) -> None:
        """Append an event record (``{"event": ..., ...}``) to metrics.jsonl."""
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.metrics_path, "a") as handle:
            handle.write(json.dumps(record) + "\n")

    def append_metrics(self, row: dict[str, Any]) -> None:
        """Append one step; its ``examples`` (raw model text) go to samples.jsonl, not metrics.jsonl."""
        self.root.mkdir(parents=True, exist_ok=True)
        row = dict(row)
        examples = row.pop("examples", [])
        if examples:
            with open(self.root / "samples.jsonl", "a") as handle:
                handle.write("".join(json.dumps({"step": row["step"], **e}) + "\n" for e in examples))
        with open(self.metrics_path, "a") as handle:
            handle.write(json.dumps(row) + "\n")
            handle.flush()
        self._log_scalars(row)

    def _log_scalars(self, row: dict[str, Any]) -> None:
        if self._tensorboard is None:
            from torch.utils.tensorboard import SummaryWriter

            self._tensorboard = SummaryWriter(str(self.root / "tensorboard"))
        step = int(row["step"])
        for key, value in row.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "step":
                self._tensorboard.add_scalar(key, value, step)
        for key, value in row.get("phase_seconds", {}).items():
            self._tensorboard.add_scalar(f"phase_seconds/{key}", value, step)
        for member in row.get("members", []):
            self._tensorboard.add_scalar(f"mu/{member['id']}", member["mu"], step)
        self._tensorboard.flush()

    def close(self) -> None:
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None

    # checkpoints -------------------------------------------------------------------------------
    def save_checkpoint(self, step: int, write: Callable[[Path], dict[str, dict[str, Any]] | None]) -> Path:
        """Call ``write(tmp_dir)`` to fill a checkpoint, then publish it as ``step-<step>`` atomically.

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
            _write_atomic(tmp / MANIFEST, json.dumps({"step": step, "files": entries}, sort_keys=True))
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
        _write_atomic(self.checkpoints / "latest", final.name)
        for old in self._step_dirs()[:-2]:  # keep the newest two
            shutil.rmtree(old, ignore_errors=True)
        return final

    def _step_dirs(self) -> list[Path]:
        return sorted(self.checkpoints.glob("step-*"), key=lambda p: int(p.name.split("-")[1]))

    def latest_checkpoint_name(self) -> str | None:
        pointer = self.checkpoints / "latest"
        return pointer.read_text().strip() if pointer.is_file() else None

    def find_checkpoint(self) -> tuple[Path | None, list[str]]:
        """The newest checkpoint (at or before ``latest``) whose files match its manifest, and a message for
        each damaged one skipped on the way."""
        name = self.latest_checkpoint_name()
        if name is None:
            return None, []
        newest = int(name.split("-")[1])
        notes = []
        for path in reversed([p for p in self._step_dirs() if int(p.name.split("-")[1]) <= newest]):
            problem = checkpoint_problem(path)
            if problem is None:
                return path, notes
            notes.append(f"checkpoint {path.name} is damaged ({problem}); using the one before it")
        return None, notes

    def latest_checkpoint(self) -> Path | None:
        """The newest undamaged checkpoint (``find_checkpoint`` without its messages)."""
        return self.find_checkpoint()[0]

    @staticmethod
    def write_json(path: Path, value: Any) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))

    @staticmethod
    def read_json(path: Path) -> Any:
        return json.loads(path.read_text())
