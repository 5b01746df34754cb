"""A run's directory: resolved config, metrics.jsonl, TensorBoard events, atomic checkpoints.

Layout::

    RUN_DIR/config.yaml            the resolved configuration
    RUN_DIR/metrics.jsonl          one JSON object per step
    RUN_DIR/samples.jsonl          a few raw proposals and answers per step, with the verifier's verdicts
    RUN_DIR/tensorboard/           TensorBoard event files
    RUN_DIR/checkpoints/step-N/    one complete checkpoint per N (written as .tmp-step-N, then renamed)
    RUN_DIR/checkpoints/latest     name of the newest complete checkpoint (replaced atomically)

A checkpoint directory appears under its final name only after every file in it is written and
synced, and ``latest`` moves only after that, so the latest checkpoint is always complete even if
the run is killed mid-write.

The driver is not the only writer of a checkpoint: each learner writes its own files
(``learners/<i>/``) straight into the temporary directory, so adapter and optimizer state never pass
through the driver. The driver first writes a random token into ``.checkpoint-id``; a learner checks
that it reads the same token before it writes or restores (``check_checkpoint_dir``), which fails
clearly where a learner's node does not share the run directory's file system.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
from pathlib import Path
from typing import Any, Callable

from configs import Config, dump_config


CHECKPOINT_ID = ".checkpoint-id"


class CheckpointDirectoryError(RuntimeError):
    """A process cannot see the checkpoint directory the driver made (no shared file system)."""


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
        self._tensorboard = None

    def create(self, config: Config) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.checkpoints.mkdir(exist_ok=True)
        _write_atomic(self.root / "config.yaml", dump_config(config))

    # metrics -----------------------------------------------------------------------------------
    def read_metrics(self) -> list[dict[str, Any]]:
        if not self.metrics_path.is_file():
            return []
        rows = []
        for line in self.metrics_path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                break  # a line cut by a kill mid-write ends the log
        return rows

    def truncate_metrics(self, last_step: int) -> None:
        """Keep the rows up to ``last_step`` (a resumed run repeats the steps after its checkpoint)."""
        rows = [r for r in self.read_metrics() if r.get("step", 0) <= last_step]
        _write_atomic(self.metrics_path, "".join(json.dumps(r) + "\n" for r in rows))

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
    def save_checkpoint(self, step: int, write: Callable[[Path], None]) -> Path:
        """Call ``write(tmp_dir)`` to fill a checkpoint, then publish it as ``step-<step>`` atomically."""
        final = self.checkpoints / f"step-{step}"
        tmp = self.checkpoints / f".tmp-step-{step}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        write(tmp)
        fsync_tree(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _write_atomic(self.checkpoints / "latest", final.name)
        for old in self._step_dirs()[:-2]:  # keep the newest two
            shutil.rmtree(old, ignore_errors=True)
        return final

    def _step_dirs(self) -> list[Path]:
        return sorted(self.checkpoints.glob("step-*"), key=lambda p: int(p.name.split("-")[1]))

    def latest_checkpoint(self) -> Path | None:
        pointer = self.checkpoints / "latest"
        if not pointer.is_file():
            return None
        path = self.checkpoints / pointer.read_text().strip()
        return path if path.is_dir() else None

    @staticmethod
    def write_json(path: Path, value: Any) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))

    @staticmethod
    def read_json(path: Path) -> Any:
        return json.loads(path.read_text())
