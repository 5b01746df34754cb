"""MLflow: one MLflow run per PopuLoRA run (experiment ``logging.project``), its id kept in RUN_DIR/tracking.json.

Tracking URI: ``logging.mlflow_tracking_uri``, else ``MLFLOW_TRACKING_URI``, else a file store in RUN_DIR/mlruns.
MLflow 3 refuses its file store unless ``MLFLOW_ALLOW_FILE_STORE=true`` (it is in maintenance mode; a database store
needs the full ``mlflow`` package, not ``mlflow-skinny``): for a file store this backend sets that variable in the
driver's environment where it is unset.

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

from reporting.tracking import SAMPLE_COLUMNS, TrackingContext

BATCH = 1000
"""Most metrics ``log_batch`` takes in one call."""
ALLOW_FILE_STORE = "MLFLOW_ALLOW_FILE_STORE"
_NOT_ALLOWED = re.compile(r"[^/\w.\- :]")


def metric_name(key: str) -> str:
    """``key`` with the characters MLflow refuses in a metric name replaced (``+`` by ``_plus``, others by ``_``)."""
    return _NOT_ALLOWED.sub(lambda m: "_plus" if m.group() == "+" else "_", key)


def tracking_uri(configured: str | None, env: Mapping[str, str], root: Path) -> str:
    """Where the run is tracked: ``configured``, else ``MLFLOW_TRACKING_URI``, else ``file:RUN_DIR/mlruns``."""
    return configured or env.get("MLFLOW_TRACKING_URI") or (Path(root).absolute() / "mlruns").as_uri()


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
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=self.uri)
        if kept.get("run_id"):
            self.run_id: str = kept["run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
            experiment_id = self.client.get_run(self.run_id).info.experiment_id
        else:
            experiment = self.client.get_experiment_by_name(context.project)
            experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(context.project)
            run = self.client.create_run(experiment_id, run_name=context.run_name,
                                         tags={"populora.run_dir": str(context.root)})
            self.run_id = run.info.run_id
            if context.config_yaml:
                self.client.log_text(self.run_id, context.config_yaml, "config.yaml")
        self.record = {"run_id": self.run_id, "experiment_id": experiment_id, "tracking_uri": self.uri}

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
