"""Experiment tracking: every step's scalars, and a table of sample proposals and answers every
``logging.samples_every`` steps, sent to the trackers ``logging.backends`` names (docs/tracking.md).

Pure core: ``scalars`` (the flat scalar keys of a metrics row, the same for every backend), ``sample_table`` (the rows
of the samples table, from the records ``samples.jsonl`` holds), ``tracking_problems`` (what stops a launch before
anything starts: a backend whose package is missing, W&B online without a key). Shell: ``Tracking`` fans a step out
to the open trackers and drops one that fails with a single warning (the run goes on; metrics.jsonl keeps every step),
and keeps each tracker's run id in ``RUN_DIR/tracking.json`` so that ``--resume`` continues the same tracked run. One
small module per backend implements ``Tracker``: ``tensorboard_backend``, ``wandb_backend``, ``mlflow_backend``.

A resumed or recovered run repeats the steps after its checkpoint; each backend takes a repeated step its own way
(docs/tracking.md): TensorBoard hides the superseded points (a purge marker), W&B gets ``step`` as a logged key and
the x-axis of every metric (its own ``_step`` keeps counting, so nothing is rejected), MLflow stores a second value
at the same step.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import netrc
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence
from urllib.parse import urlparse

from configs.schema import TRACKING_BACKENDS

log = logging.getLogger("populora.tracking")

TRACKING_FILE = "tracking.json"
"""RUN_DIR/tracking.json: each tracker's run id (and where it lives), read back by ``--resume``."""
PACKAGES = {"wandb": "wandb", "mlflow": "mlflow"}
"""The module each optional backend imports (installed by the ``tracking`` extra)."""
WANDB_QUIET_MODES = ("offline", "dryrun", "disabled")
"""``WANDB_MODE`` values that need no API key."""
WANDB_DEFAULT_HOST = "https://api.wandb.ai"
SAMPLE_COLUMNS = ("step", "teacher", "family", "valid", "reason", "proposal", "student", "answer", "correct",
                  "answer_reason")
"""The columns of the samples table (``sample_table``)."""
INSTALL_HINT = "pip install -e '.[tracking]' (or bash install.sh cpu tracking)"


class Tracker(Protocol):
    """One backend's tracked run. ``record``: what RUN_DIR/tracking.json keeps of it (its run id and where it lives),
    given back as ``TrackingContext.kept`` on ``--resume`` to continue it (None: nothing to keep). A tracker may
    also have ``view``, one line saying where a user finds it (``Tracking.views``, printed as the run starts)."""

    name: str
    run_id: str | None
    record: Mapping[str, Any] | None

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        """Record ``scalars`` at ``step``; a ``step`` at or before one already logged is a rewind (resume, recovery)."""

    def log_table(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        """Record the samples table (``sample_table``'s rows, ``SAMPLE_COLUMNS``) at ``step``."""

    def close(self) -> None:
        """Flush and end this session of the tracked run."""


@dataclass(frozen=True)
class TrackingContext:
    """What a backend needs to open (or reopen) its tracked run."""

    root: Path
    """The run directory (W&B's files go under it unless WANDB_DIR is set; MLflow's default file store too)."""
    run_name: str
    project: str
    config: dict[str, Any] = field(default_factory=dict)
    """The resolved configuration (W&B's run config; MLflow's config.yaml artifact)."""
    config_yaml: str = ""
    start_step: int | None = None
    """The first step this session logs (a resumed run's checkpoint step + 1); None for a fresh run."""
    kept: Mapping[str, Any] = field(default_factory=dict)
    """This backend's record in tracking.json from an earlier session (empty: open a new tracked run)."""
    wandb_entity: str | None = None
    mlflow_tracking_uri: str | None = None
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))


# pure core -----------------------------------------------------------------------------------------------------------
def scalars(row: Mapping[str, Any]) -> dict[str, float]:
    """The scalars of a metrics row, flat: every numeric top-level key but ``step`` (booleans are not scalars),
    ``phase_seconds/<phase>`` and ``mu/<member id>``. Every backend gets these keys."""
    out: dict[str, float] = {}
    for key, value in row.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "step":
            out[key] = value
    for key, value in row.get("phase_seconds", {}).items():
        out[f"phase_seconds/{key}"] = value
    for member in row.get("members", []):
        out[f"mu/{member['id']}"] = member["mu"]
    return out


def sample_table(step: int, examples: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per sample proposal (``reporting.step_metrics.examples``' records, samples.jsonl's lines) with the
    student's first answer to it where there was one; columns ``SAMPLE_COLUMNS``."""
    rows = []
    for record in examples:
        answer = record.get("answer") or {}
        rows.append({
            "step": step, "teacher": record.get("member"), "family": record.get("family"),
            "valid": record.get("valid"), "reason": record.get("reason"), "proposal": record.get("text"),
            "student": answer.get("member"), "answer": answer.get("text"), "correct": answer.get("correct"),
            "answer_reason": answer.get("reason"),
        })
    return rows


def wandb_online(env: Mapping[str, str]) -> bool:
    """Whether W&B would sync to its server: ``WANDB_MODE`` unset or online (not offline, dryrun or disabled), and
    ``WANDB_DISABLED`` not set true."""
    if env.get("WANDB_DISABLED", "").lower() in ("true", "1", "yes"):
        return False
    return env.get("WANDB_MODE", "online").strip().lower() not in WANDB_QUIET_MODES


def tracking_problems(backends: Sequence[str], env: Mapping[str, str], installed: Callable[[str], bool],
                      wandb_credentials: Callable[[], bool]) -> list[str]:
    """What keeps ``logging.backends`` from working here, each naming the key and the fix (empty: nothing):
    a backend whose package is missing; W&B online with no API key."""
    problems = []
    for backend in backends:
        module = PACKAGES.get(backend)
        if module and not installed(module):
            problems.append(f"logging.backends includes {backend}, but the {module} package is not installed: "
                            f"{INSTALL_HINT}, or remove {backend} from logging.backends")
    if "wandb" in backends and installed("wandb") and wandb_online(env) and not wandb_credentials():
        problems.append("logging.backends includes wandb in online mode (WANDB_MODE is "
                        f"{env.get('WANDB_MODE') or 'unset'}), but no W&B API key is set (WANDB_API_KEY, or a ~/.netrc "
                        "entry from `wandb login`): run `wandb login`, or set WANDB_MODE=offline (then `wandb sync` "
                        "the run's offline directories), or remove wandb from logging.backends")
    return problems


# shell ---------------------------------------------------------------------------------------------------------------
def module_installed(name: str) -> bool:
    """Whether ``name`` can be imported here (without importing it)."""
    return importlib.util.find_spec(name) is not None


def wandb_credentials(env: Mapping[str, str]) -> bool:
    """Whether W&B finds a key without asking: ``WANDB_API_KEY`` or ``WANDB_IDENTITY_TOKEN_FILE``, or an entry for
    the host of ``WANDB_BASE_URL`` (default api.wandb.ai) in the netrc file (``NETRC``, else ~/.netrc)."""
    if env.get("WANDB_API_KEY") or env.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    host = urlparse(env.get("WANDB_BASE_URL") or WANDB_DEFAULT_HOST).hostname or ""
    path = Path(env["NETRC"]) if env.get("NETRC") else Path(env.get("HOME") or Path.home()) / ".netrc"
    try:
        return netrc.netrc(str(path)).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def check_tracking(backends: Sequence[str], env: Mapping[str, str] | None = None) -> str | None:
    """``tracking_problems`` of this machine in one line (None: nothing stops the trackers)."""
    env = os.environ if env is None else env
    problems = tracking_problems(backends, env, module_installed, lambda: wandb_credentials(env))
    return "; ".join(problems) if problems else None


def read_kept(root: Path) -> dict[str, Any]:
    """RUN_DIR/tracking.json (empty where there is none or it cannot be read)."""
    try:
        kept = json.loads((Path(root) / TRACKING_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return kept if isinstance(kept, dict) else {}


def open_backend(name: str, context: TrackingContext) -> Tracker:
    """The tracker of backend ``name`` (``logging.backends``' values), opened; raises what the backend raises."""
    if name == "tensorboard":
        from reporting.tracking.tensorboard_backend import TensorBoardTracker

        return TensorBoardTracker(context)
    if name == "wandb":
        from reporting.tracking.wandb_backend import WandbTracker

        return WandbTracker(context)
    if name == "mlflow":
        from reporting.tracking.mlflow_backend import MlflowTracker

        return MlflowTracker(context)
    raise ValueError(f"unknown tracking backend {name!r} (known: {', '.join(TRACKING_BACKENDS)})")


class Tracking:
    """The open trackers of one run session. A tracker that raises (on opening, logging or closing) is dropped with
    one warning and the run goes on; the others, and metrics.jsonl, keep every step."""

    def __init__(self, trackers: list[Tracker], samples_every: int):
        self.trackers = list(trackers)
        self.samples_every = samples_every
        self.dropped: list[str] = []

    @classmethod
    def open(cls, backends: Sequence[str], samples_every: int, context: TrackingContext) -> "Tracking":
        """Open ``backends`` (each continuing its tracked run kept in RUN_DIR/tracking.json, if any) and record their
        run ids there."""
        kept = read_kept(context.root)
        tracking = cls([], samples_every)
        for name in backends:
            try:
                tracker = open_backend(name, replace(context, kept=kept.get(name) or {}))
            except Exception as exc:  # a backend that cannot open is one warning, not the end of the run
                tracking._warn(name, "could not start", exc)
                continue
            tracking.trackers.append(tracker)
            if tracker.record:
                kept[name] = dict(tracker.record)
        if kept:
            from checkpoints import write_atomic

            try:
                write_atomic(Path(context.root) / TRACKING_FILE, json.dumps(kept, indent=1))
            except OSError as exc:  # the trackers run; only a later --resume would start new tracked runs
                log.warning("tracking: could not write %s (%s); a --resume will start new tracked runs",
                            Path(context.root) / TRACKING_FILE, exc)
        return tracking

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.trackers]

    def views(self) -> list[str]:
        """Where a user finds each open tracked run, one line per tracker that says (``view``: MLflow's URI)."""
        return [t.view for t in self.trackers if getattr(t, "view", None)]

    def _warn(self, name: str, what: str, exc: BaseException) -> None:
        self.dropped.append(name)
        kept = [t.name for t in self.trackers if t.name != name]
        text = str(exc).strip()
        log.warning("tracking: %s %s (%s: %s); dropped for the rest of this run, which goes on (metrics.jsonl%s keep "
                    "every step)", name, what, type(exc).__name__, text.splitlines()[0][:300] if text else "",
                    "".join(f", {k}" for k in kept))

    def _each(self, what: str, call: Callable[[Tracker], None], closing: bool = False) -> None:
        for tracker in list(self.trackers):
            try:
                call(tracker)
            except Exception as exc:
                self.trackers.remove(tracker)
                self._warn(tracker.name, f"failed {what}", exc)
                if not closing:
                    try:
                        tracker.close()
                    except Exception:  # noqa: BLE001 - it already failed, and said so once
                        pass

    def log_step(self, row: Mapping[str, Any], examples: Sequence[Mapping[str, Any]] = ()) -> None:
        """Send one metrics row's ``scalars`` to every tracker, and its ``examples`` as the samples table where the
        step is a multiple of ``samples_every``."""
        step = int(row["step"])
        values = scalars(row)
        self._each(f"at step {step}", lambda t: t.log(step, values))
        if examples and self.samples_every and step % self.samples_every == 0:
            rows = sample_table(step, examples)
            self._each(f"logging the samples table of step {step}", lambda t: t.log_table(step, rows))

    def close(self) -> None:
        """Close every tracker (one that fails to close: one warning)."""
        self._each("closing", lambda t: t.close(), closing=True)
        self.trackers = []
