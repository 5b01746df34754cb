"""A run's directory: resolved config, metrics.jsonl, TensorBoard events, status, logs (and its checkpoints).

Layout::

    RUN_DIR/config.yaml            the resolved configuration
    RUN_DIR/metrics.jsonl          one JSON object per step
    RUN_DIR/samples.jsonl          a few raw proposals and answers per step, with the verifier's verdicts
    RUN_DIR/proposals.jsonl        one record per proposal: validity, rho, complexity, reward, advantage
                                   (``reporting.proposal_records``)
    RUN_DIR/tensorboard/           TensorBoard event files
    RUN_DIR/checkpoints/step-N/    one complete checkpoint per N (written as .tmp-step-N, then renamed)
    RUN_DIR/checkpoints/latest     name of the newest complete checkpoint (replaced atomically)
    RUN_DIR/status.json            why the run stopped: running / finished / interrupted / failed, the cause,
                                   the recoveries, the last step (``running`` after a kill: nobody wrote it)
    RUN_DIR/logs/driver.log        the driver's log records (INFO and up; DEBUG with --verbose)
    RUN_DIR/logs/<actor>.log       each actor's stdout, stderr and log records (``route_output``), one file per
                                   actor name, appended to by a restarted actor

The checkpoints (their atomic writes, manifests, tokens and checks) are ``checkpoints``'s; a
``RunDirectory`` is a ``checkpoints.CheckpointStore`` plus the run's records.

``metrics.jsonl`` holds one row per step and, between them, event records (``{"event": "recovery",
...}``) that are not steps: ``read_metrics`` returns the steps, ``read_events`` the events.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from checkpoints import CheckpointStore, write_atomic
from configs import Config, dump_config

LOG_DIR_ENV = "POPULORA_LOG_DIR"
"""Set by the driver in the actors' environment (``actors.cluster.connect``): where ``route_output`` writes."""
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
SIDE_FILES = {"examples": "samples.jsonl", "proposals": "proposals.jsonl"}
"""Lists of records a step row carries that go to a file of their own (row key -> file name)."""


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


class RunDirectory(CheckpointStore):
    """Owns every file of one run (the driver is its only writer)."""

    def __init__(self, root: Path):
        super().__init__(root)
        self.metrics_path = self.root / "metrics.jsonl"
        self.logs = self.root / "logs"
        self._tensorboard = None

    def create(self, config: Config) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.checkpoints.mkdir(exist_ok=True)
        write_atomic(self.root / "config.yaml", dump_config(config))

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
        write_atomic(self.status_path, json.dumps({
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
        """The step rows, in order (event records that name a step, such as a checkpoint's, are events)."""
        return [r for r in self._records() if "step" in r and "event" not in r]

    def read_events(self, kind: str | None = None) -> list[dict[str, Any]]:
        """The event records (``recovery``; ``checkpoint`` with its step and seconds), in order; only ``kind``'s if given."""
        return [r for r in self._records() if "event" in r and kind in (None, r["event"])]

    def truncate_metrics(self, last_step: int) -> None:
        """Keep the rows up to ``last_step`` and every event (a resumed or recovered run repeats the steps after
        its checkpoint); the side files (``SIDE_FILES``) likewise."""
        rows = [r for r in self._records() if r.get("step", 0) <= last_step]
        write_atomic(self.metrics_path, "".join(json.dumps(r) + "\n" for r in rows))
        for name in SIDE_FILES.values():
            side = self.root / name
            if side.is_file():
                kept = [line for line in side.read_text().splitlines(keepends=True)
                        if line.endswith("\n") and json.loads(line).get("step", 0) <= last_step]
                write_atomic(side, "".join(kept))

    def read_side(self, key: str) -> list[dict[str, Any]]:
        """The records of a row's side file (``SIDE_FILES[key]``), each with its ``step``; a line cut by a kill ends them."""
        path = self.root / SIDE_FILES[key]
        out: list[dict[str, Any]] = []
        if path.is_file():
            for line in path.read_text().splitlines():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    break
        return out

    def append_event(self, record: dict[str, Any]) -> None:
        """Append an event record (``{"event": ..., ...}``) to metrics.jsonl."""
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.metrics_path, "a") as handle:
            handle.write(json.dumps(record) + "\n")

    def append_metrics(self, row: dict[str, Any]) -> None:
        """Append one step; its lists of records (``SIDE_FILES``: raw model text, one record per proposal) go to
        their own files, one line per record with the step, not to metrics.jsonl."""
        self.root.mkdir(parents=True, exist_ok=True)
        row = dict(row)
        for key, name in SIDE_FILES.items():
            records = row.pop(key, [])
            if records:
                with open(self.root / name, "a") as handle:
                    handle.write("".join(json.dumps({"step": row["step"], **e}) + "\n" for e in records))
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
    @staticmethod
    def write_json(path: Path, value: Any) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))

    @staticmethod
    def read_json(path: Path) -> Any:
        return json.loads(path.read_text())


def comparable_state(run_dir: Path, step: int) -> tuple[dict, dict[str, bytes], list[dict]]:
    """What two runs that should end equal are compared by (a killed-and-recovered or resumed run against one without
    the fault): the league state and the adapter files of checkpoint ``step-<step>``, and the step rows without their
    timings."""
    checkpoint = Path(run_dir) / "checkpoints" / f"step-{step}"
    league = json.loads((checkpoint / "league.json").read_text())
    adapters = {p.relative_to(checkpoint).as_posix(): p.read_bytes()
                for p in sorted((checkpoint / "learners").rglob("adapter_model.safetensors"))}
    rows = [{k: v for k, v in r.items() if k != "phase_seconds"} for r in RunDirectory(run_dir).read_metrics()]
    return league, adapters, rows
