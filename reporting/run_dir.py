"""A run's directory: resolved config, metrics.jsonl, TensorBoard events, status, logs (and its checkpoints).

Layout::

    RUN_DIR/config.yaml            the resolved configuration
    RUN_DIR/metrics.jsonl          one JSON object per step
    RUN_DIR/samples.jsonl          a few raw proposals and answers per step, with the verifier's verdicts
    RUN_DIR/proposals.jsonl        one record per proposal: validity, rho, complexity, reward, advantage
                                   (``reporting.proposal_records``)
    RUN_DIR/tensorboard/           TensorBoard event files (``logging.backends``: tensorboard, the default)
    RUN_DIR/tracking.json          the run ids of the W&B / MLflow runs tracking it (``reporting.tracking``), which
                                   ``--resume`` continues
    RUN_DIR/wandb/, RUN_DIR/mlflow.db  W&B's files (unless WANDB_DIR is set) and MLflow's default store (SQLite;
                                   its artifacts in RUN_DIR/mlartifacts/)
    RUN_DIR/checkpoints/step-N/    one complete checkpoint per N (written as .tmp-step-N, then renamed)
    RUN_DIR/checkpoints/latest     name of the newest complete checkpoint (replaced atomically)
    RUN_DIR/status.json            why the run stopped: running / finished / interrupted / failed, the cause,
                                   the recoveries, the last step (``running`` after a kill: nobody wrote it)
    RUN_DIR/logs/driver.log        the driver's log records (INFO and up; DEBUG with --verbose)
    RUN_DIR/logs/<actor>.log       each actor's stdout, stderr and log records (``route_output``), one file per
                                   actor name, appended to by a restarted actor

The checkpoints (their atomic writes, manifests, tokens and checks) are ``checkpoints``'s; a
``RunDirectory`` is a ``checkpoints.CheckpointStore`` plus the run's records.

Where a run directory is (``resolve_run_dir``) and whether a fresh run may use it (``fresh_run_refusal``: a
directory that holds a run takes only ``--resume``) are decided here, before anything starts: plain functions of
the path, the environment and the current directory.

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
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from checkpoints import CheckpointStore, write_atomic
from configs import Config, dump_config
from configs.schema import LoggingConfig

if TYPE_CHECKING:
    from reporting.tracking import Tracking

LOG_DIR_ENV = "POPULORA_LOG_DIR"
"""Set by the driver in the actors' environment (``actors.cluster.connect``): where ``route_output`` writes."""
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
SIDE_FILES = {"examples": "samples.jsonl", "proposals": "proposals.jsonl"}
"""Lists of records a step row carries that go to a file of their own (row key -> file name)."""
RUN_MARKERS = ("config.yaml", "metrics.jsonl", "checkpoints")
"""What makes a directory hold a run: any of these in it."""
LOCAL_RUN_ROOT = Path("runs")
"""``run.root``'s default for ``launch.py`` run directly: runs/ in the current directory."""
JOB_RUN_ROOT = Path("~/populora-runs")
"""``run.root``'s default under ``ray job submit``, expanded on the node the driver runs on (the head)."""
RAY_JOB_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"
"""Set by Ray's job manager in the environment of a ``ray job submit`` entrypoint (the job's runtime env)."""
RAY_WORKING_DIR_FILES = ("runtime_resources", "working_dir_files")
"""Path parts of Ray's unpacked copies of a job's ``--working-dir`` (under Ray's temporary directory)."""


class RunDirectoryError(ValueError):
    """A run directory that cannot be used as asked; the message says why and what to do."""


def in_ray_job(env: Mapping[str, str], cwd: Path) -> bool:
    """Whether this process is the entrypoint of a ``ray job submit``: Ray's job manager sets ``RAY_JOB_ENV`` for it,
    and with ``--working-dir`` it runs inside Ray's unpacked copy (``.../runtime_resources/working_dir_files/...``),
    where nothing written is meant to last."""
    parts = Path(cwd).parts
    copied = any(parts[i:i + 2] == RAY_WORKING_DIR_FILES for i in range(len(parts) - 1))
    return bool(env.get(RAY_JOB_ENV)) or copied


def expand_home(path: Path, env: Mapping[str, str]) -> Path:
    """``path`` with a leading ``~`` replaced by ``env["HOME"]`` (else the user's home)."""
    text = str(path)
    if text != "~" and not text.startswith("~/"):
        return Path(path)
    home = env.get("HOME") or str(Path.home())
    return Path(home + text[1:])


def run_root(root: Path | None, job: bool, cwd: Path, env: Mapping[str, str]) -> Path:
    """The absolute directory run directories go under (``run.root``): as configured (a relative one against
    ``cwd``), else ``LOCAL_RUN_ROOT`` in ``cwd``, or ``JOB_RUN_ROOT`` when ``job`` (a ``ray job submit``
    entrypoint, whose ``cwd`` is Ray's temporary copy: a relative ``run.root`` is refused there)."""
    if root is None:
        return expand_home(JOB_RUN_ROOT, env) if job else Path(cwd) / LOCAL_RUN_ROOT
    root = expand_home(Path(root), env)
    if root.is_absolute():
        return root
    if job:
        raise RunDirectoryError(
            f"run.root={root} is relative, and under `ray job submit` the current directory is Ray's temporary copy of "
            "--working-dir (deleted with Ray's cache): give an absolute run.root (on several nodes, one every node mounts)")
    return Path(os.path.normpath(Path(cwd) / root))


def resolve_run_dir(run_dir: Path | None, name: str, root: Path | None, env: Mapping[str, str], cwd: Path,
                    now: datetime) -> Path:
    """The absolute run directory of ``run.run_dir`` (``--run-dir``/``--resume``): an absolute one as given; a
    relative one against ``cwd``, or under a ``ray job submit`` (``in_ray_job``) against ``run_root``; none:
    ``run_root/<name>-<YYYYmmdd-HHMMSS of now>``."""
    job = in_ray_job(env, cwd)
    if run_dir is None:
        return run_root(root, job, cwd, env) / f"{name}-{now.strftime('%Y%m%d-%H%M%S')}"
    path = expand_home(Path(run_dir), env)
    if path.is_absolute():
        return path
    return Path(os.path.normpath((run_root(root, job, cwd, env) if job else Path(cwd)) / path))


def config_run_dir(config: Config) -> Path:
    """``resolve_run_dir`` of ``config``'s run.run_dir, run.name and run.root in this process (its environment,
    current directory and clock): what ``launch.py`` and ``actors.driver.train`` use."""
    return resolve_run_dir(config.run.run_dir, config.run.name, config.run.root, os.environ, Path.cwd(), datetime.now())


def run_markers(directory: Path) -> list[str]:
    """Which of ``RUN_MARKERS`` ``directory`` holds (empty: it holds no run, or does not exist)."""
    return [name for name in RUN_MARKERS if (Path(directory) / name).exists()]


def fresh_run_refusal(directory: Path) -> str | None:
    """Why a fresh run (no ``--resume``) may not start in ``directory``, or None where it may: a directory that holds
    a run (``run_markers``) would have its metrics appended to and its checkpoints mixed with the new run's. The
    message names ``--resume`` and another ``--run-dir``, and for a run stopped before its first checkpoint that it
    cannot be resumed and how to start over."""
    found = run_markers(directory)
    if not found:
        return None
    held = ", ".join(f"{name}/" if name == "checkpoints" else name for name in found)
    latest = CheckpointStore(Path(directory)).latest_checkpoint_name()
    if latest is not None and (Path(directory) / "checkpoints" / latest).is_dir():
        return (f"{directory} already holds a run ({held}; latest checkpoint {latest}); a new run there would mix its "
                f"metrics and checkpoints with that run's. Continue that run with: python launch.py --resume {directory}"
                f" - or start the new run in another directory: --run-dir OTHER_DIR")
    return (f"{directory} holds a run that stopped before its first checkpoint ({held}; no checkpoint), so it cannot "
            f"be resumed (--resume {directory} needs one). To start over there, remove it first (rm -r {directory}); "
            f"or start the new run in another directory: --run-dir OTHER_DIR")


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
        self.tracking: Tracking | None = None

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
        their own files, one line per record with the step, not to metrics.jsonl. Then the trackers get the step
        (``open_tracking``; TensorBoard alone where it was not called)."""
        self.root.mkdir(parents=True, exist_ok=True)
        row = dict(row)
        side = {key: row.pop(key, []) for key in SIDE_FILES}
        for key, name in SIDE_FILES.items():
            if side[key]:
                with open(self.root / name, "a") as handle:
                    handle.write("".join(json.dumps({"step": row["step"], **e}) + "\n" for e in side[key]))
        with open(self.metrics_path, "a") as handle:
            handle.write(json.dumps(row) + "\n")
            handle.flush()
        if self.tracking is None:
            self.open_tracking(LoggingConfig())
        self.tracking.log_step(row, side["examples"])

    def open_tracking(self, logging_config: LoggingConfig, config: Config | None = None,
                      start_step: int | None = None) -> list[str]:
        """Open the trackers of ``logging_config`` (``reporting.tracking``) for this session of the run, continuing the
        tracked runs RUN_DIR/tracking.json keeps; ``start_step``: a resumed run's first step (None: a fresh run).
        A tracker that cannot open is one warning. Returns the names of those open."""
        from reporting.tracking import Tracking, TrackingContext

        self.close()
        context = TrackingContext(
            root=self.root, run_name=config.run.name if config else self.root.name, project=logging_config.project,
            config=config.model_dump(mode="json") if config else {}, config_yaml=dump_config(config) if config else "",
            start_step=start_step, wandb_entity=logging_config.wandb_entity,
            mlflow_tracking_uri=logging_config.mlflow_tracking_uri, env=dict(os.environ))
        self.tracking = Tracking.open(logging_config.backends, logging_config.samples_every, context)
        return self.tracking.names

    def close(self) -> None:
        """Close the trackers (a tracker that fails to close: one warning)."""
        if self.tracking is not None:
            self.tracking.close()
            self.tracking = None

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
