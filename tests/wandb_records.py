"""Read what a W&B offline run recorded, from its transaction log (``offline-run-*/run-<id>.wandb``).

wandb 0.31 writes no ``files/wandb-summary.json`` for an offline run (wandb/wandb#9646; the fix, wandb/wandb#11279,
was still open): the history rows and summary updates are only in the run's transaction log, which ``wandb sync``
uploads. That log is LevelDB's log format behind a 7-byte header (``:W&B``, magic 0xBEE1, version): 32 KiB blocks of
chunks (4-byte checksum, 2-byte length, 1-byte type: full, first, middle, last), each record a
``wandb.proto.wandb_internal_pb2.Record``.
"""

from __future__ import annotations

import json
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

BLOCK = 32768
CHUNK_HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def raw_records(path: Path) -> Iterator[bytes]:
    """The records of a ``.wandb`` transaction log, reassembled from their chunks."""
    data = Path(path).read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path} is not a W&B transaction log (header {data[:7]!r})")
    pos, pending = 7, b""
    while pos + CHUNK_HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < CHUNK_HEADER:  # the block's tail is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + CHUNK_HEADER])
        if kind == 0 and length == 0:
            pos += left
            continue
        chunk = data[pos + CHUNK_HEADER:pos + CHUNK_HEADER + length]
        pos += CHUNK_HEADER + length
        if kind == FULL:
            yield chunk
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            yield pending + chunk
            pending = b""


def _items(items: Any) -> dict[str, Any]:
    return {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in items}


@dataclass
class OfflineRun:
    """One offline run directory's records: its id, the history rows in order, the summary it ended with, and whether
    its log is complete (W&B's ``exit`` record, written last)."""

    directory: Path
    run_id: str
    history: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    complete: bool = False


def read_offline_run(directory: Path, wait_s: float = 20.0) -> OfflineRun:
    """The records of ``directory`` (``offline-run-<time>-<id>``). W&B's service writes the log after ``finish()``
    returns, so this reads it again until it ends with the run's ``exit`` record, at most ``wait_s``."""
    from wandb.proto import wandb_internal_pb2

    (log_path,) = Path(directory).glob("run-*.wandb")
    deadline = time.monotonic() + wait_s
    while True:
        run = OfflineRun(Path(directory), log_path.stem[len("run-"):])
        for raw in raw_records(log_path):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(raw)
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run.run_id = record.run.run_id
            elif kind == "history":
                run.history.append(_items(record.history.item))
            elif kind == "summary":
                run.summary.update(_items(record.summary.update))
            elif kind == "exit":
                run.complete = True
        if run.complete or time.monotonic() > deadline:
            return run
        time.sleep(0.2)


def offline_runs(wandb_dir: Path, run_id: str) -> list[OfflineRun]:
    """Every offline run directory of ``run_id`` under ``wandb_dir``/wandb, oldest first."""
    return [read_offline_run(d) for d in sorted((Path(wandb_dir) / "wandb").glob(f"offline-run-*-{run_id}"))]
