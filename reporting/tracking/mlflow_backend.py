"""MLflow: one MLflow run per PopuLoRA run (experiment ``logging.project``), its id kept in RUN_DIR/tracking.json.

Tracking URI: ``logging.mlflow_tracking_uri``, else ``MLFLOW_TRACKING_URI``, else a SQLite store in the run directory,
``sqlite:///RUN_DIR/mlflow.db`` (artifacts in RUN_DIR/mlartifacts), which ``mlflow ui --backend-store-uri`` opens as
it is (MLflow's SQL store needs SQLAlchemy and Alembic beside ``mlflow-skinny``: the ``tracking`` extra). A file
store (``file:``, a plain path) still works where a user names one, or a resumed run kept one: MLflow 3 refuses it
unless ``MLFLOW_ALLOW_FILE_STORE=true``, which this backend then sets in the driver's environment where it is unset.

Settings: a new tracked run gets every setting of the resolved configuration as a parameter, its dotted key as
launch.py takes it (``rl.learning_rate`` = ``0.0005``; ``configs.loading.dotted_settings``), and the tags
``populora.tiny_variant``, ``populora.population`` and ``populora.inference_backend``. MLflow parameters cannot
change, so a session that resumes it with other settings records each setting that differs as the tag
``populora.resumed.<dotted.key>`` (its value in the newest session that changed it) and the session's first step as
``populora.resumed_at_step``; the parameters keep the run's first settings.

Steps: MLflow keeps every value it is given with its step and timestamp, so a repeated step (resume, recovery) is a
second value at that step (``get_metric_history`` returns both, in order); the run's latest value of a metric is the
one at the highest step, the newest among equals. Metric names: MLflow allows letters, digits, ``_ - . / : `` and
spaces; any other character is replaced (``+`` by ``_plus``, others by ``_``: ``eval/humaneval+/t0`` becomes
``eval/humaneval_plus/t0``). The samples table is a JSON artifact ``samples/step-NNNNNN.json`` in the layout of
``mlflow.log_table`` (``columns``, ``data``; that function itself needs pandas, which ``mlflow-skinny`` does not pull).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any, Mapping, Sequence
from urllib.parse import urlparse

from configs.loading import dotted_settings
from reporting.tracking import SAMPLE_COLUMNS, TrackingContext

BATCH = 1000
"""Most metrics ``log_batch`` takes in one call."""
PARAMS_BATCH = 100
"""Most parameters, and most tags, ``log_batch`` takes in one call."""
MAX_PARAM_CHARS = 6000
"""The longest parameter value MLflow stores."""
ALLOW_FILE_STORE = "MLFLOW_ALLOW_FILE_STORE"
STORE_FILE = "mlflow.db"
"""The default store: a SQLite database in the run directory."""
ARTIFACTS_DIR = "mlartifacts"
"""The default store's artifacts, in the run directory."""
RESUMED_TAG = "populora.resumed."
_NOT_ALLOWED = re.compile(r"[^/\w.\- :]")


def metric_name(key: str) -> str:
    """``key`` with the characters MLflow refuses in a metric name replaced (``+`` by ``_plus``, others by ``_``)."""
    return _NOT_ALLOWED.sub(lambda m: "_plus" if m.group() == "+" else "_", key)


def tracking_uri(configured: str | None, env: Mapping[str, str], root: Path) -> str:
    """Where the run is tracked: ``configured``, else ``MLFLOW_TRACKING_URI``, else ``sqlite:///RUN_DIR/mlflow.db``."""
    return configured or env.get("MLFLOW_TRACKING_URI") or default_store(root)


def default_store(root: Path) -> str:
    """The SQLite store in run directory ``root`` (an absolute path: ``sqlite:////abs/RUN_DIR/mlflow.db``)."""
    return f"sqlite:///{Path(root).absolute() / STORE_FILE}"


def run_tags(config: Mapping[str, Any]) -> dict[str, str]:
    """The tags of a run's configuration (``model_dump``): the tiny variant (or ``none``: a model path), the
    population (``2 teachers + 2 students`` or ``single agent``) and ``inference.backend``."""
    model, population = config.get("model", {}), config.get("population", {})
    single = population.get("single_agent")
    return {
        "populora.tiny_variant": str(model.get("tiny_variant")) if model.get("path") == "tiny" else "none",
        "populora.population": "single agent" if single else
        f"{population.get('teachers')} teachers + {population.get('students')} students",
        "populora.inference_backend": str(config.get("inference", {}).get("backend")),
    }


def resumed_tags(logged: Mapping[str, str], settings: Mapping[str, str], start_step: int | None) -> dict[str, str]:
    """What a resumed session records of its settings: each one that differs from the run's parameters (``logged``)
    as ``populora.resumed.<key>``, with ``populora.resumed_at_step``; nothing where none differs."""
    changed = {f"{RESUMED_TAG}{key}": value for key, value in settings.items() if logged.get(key) != value[:MAX_PARAM_CHARS]}
    if changed and start_step is not None:
        changed["populora.resumed_at_step"] = str(start_step)
    return changed


def is_file_store(uri: str) -> bool:
    """Whether ``uri`` names MLflow's file store (a ``file:`` URI or a plain path)."""
    return urlparse(uri).scheme in ("", "file")


class MlflowTracker:
    """An MLflow run, through ``MlflowClient`` (no global active run)."""

    name = "mlflow"

    def __init__(self, context: TrackingContext):
        kept = dict(context.kept)
        self.uri = kept.get("tracking_uri") or tracking_uri(context.mlflow_tracking_uri, context.env, context.root)
        if is_file_store(self.uri):
            os.environ.setdefault(ALLOW_FILE_STORE, "true")
        from mlflow.entities import Param, RunTag
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=self.uri)
        settings = dotted_settings(context.config)
        tags = run_tags(context.config) if context.config else {}
        if kept.get("run_id"):
            self.run_id: str = kept["run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
            run = self.client.get_run(self.run_id)
            experiment_id = run.info.experiment_id
            tags.update(resumed_tags(run.data.params, settings, context.start_step))
            settings = {}  # parameters cannot change: a resumed session's settings are tags
        else:
            experiment = self.client.get_experiment_by_name(context.project)
            artifacts = (Path(context.root).absolute() / ARTIFACTS_DIR).as_uri() if self.uri == default_store(context.root) else None
            experiment_id = experiment.experiment_id if experiment else \
                self.client.create_experiment(context.project, artifact_location=artifacts)
            run = self.client.create_run(experiment_id, run_name=context.run_name,
                                         tags={"populora.run_dir": str(context.root)})
            self.run_id = run.info.run_id
            if context.config_yaml:
                self.client.log_text(self.run_id, context.config_yaml, "config.yaml")
        params = [Param(key, value[:MAX_PARAM_CHARS]) for key, value in settings.items()]
        tagged = [RunTag(key, value) for key, value in tags.items()]
        for start in range(0, max(len(params), len(tagged)), PARAMS_BATCH):
            self.client.log_batch(self.run_id, params=params[start:start + PARAMS_BATCH],
                                  tags=tagged[start:start + PARAMS_BATCH])
        self.record = {"run_id": self.run_id, "experiment_id": experiment_id, "tracking_uri": self.uri}
        self.view = f"mlflow: {self.uri} (view it with: mlflow ui --backend-store-uri {self.uri})" \
            if urlparse(self.uri).scheme in ("sqlite", "file", "") else f"mlflow: {self.uri}"

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(metric_name(k), float(v), now, step) for k, v in scalars.items()]
        for start in range(0, len(metrics), BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[start:start + BATCH])

    def log_table(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        table = {"columns": list(SAMPLE_COLUMNS), "data": [[row.get(c) for c in SAMPLE_COLUMNS] for row in rows]}
        self.client.log_dict(self.run_id, table, f"samples/step-{step:06d}.json")

    def close(self) -> None:
        self.client.set_terminated(self.run_id)
