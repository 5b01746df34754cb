"""Weights & Biases: one W&B run per PopuLoRA run, its id kept in RUN_DIR/tracking.json.

Steps: W&B's own step (``_step``) only moves forward and drops data logged to a step below it ("Tried to log to step
N that is less than the current step M ... this data will be ignored"; measured with wandb 0.31: after steps 1-3,
``log(..., step=2)`` is dropped). So the run's step is a logged key, ``step``, and the x-axis of every metric
(``define_metric("*", step_metric="step")``); ``log`` never passes ``step=``. A repeated step (resume, recovery) is
then a new history row with the same ``step``: nothing is rejected, and charts over ``step`` show both values at that
step. (W&B's ``resume_from`` rewind is a private preview and needs monotonic steps; it is not used.)

Resume: ``wandb.init(id=<kept id>, resume="allow")`` continues the same run online. Offline (``WANDB_MODE=offline``)
W&B cannot resume: each session writes its own ``offline-run-<time>-<id>`` directory with the same id; ``wandb sync``
uploads them.

Files: under ``WANDB_DIR`` when set, else RUN_DIR/wandb/. W&B's console capture is off (the driver's terminal and
RUN_DIR/logs/driver.log hold the output) and it is quiet (its start lines only, no history printed at the end).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from reporting.tracking import SAMPLE_COLUMNS, TrackingContext

STEP_KEY = "step"
TABLE_KEY = "samples"


class WandbTracker:
    """A W&B run (``wandb.init``), continued where RUN_DIR/tracking.json keeps its id."""

    name = "wandb"

    def __init__(self, context: TrackingContext):
        import wandb

        kept = dict(context.kept)
        project = kept.get("project") or context.project
        entity = kept.get("entity") or context.wandb_entity
        init: dict[str, Any] = {
            "project": project, "entity": entity, "name": context.run_name,
            "settings": wandb.Settings(console="off", quiet=True),  # no history and summary printed at the end
        }
        # Given explicitly: W&B reads its environment once per process (wandb.setup), not at each init.
        init["dir"] = context.env.get("WANDB_DIR") or str(context.root)  # W&B makes its wandb/ folder there
        mode = context.env.get("WANDB_MODE", "").strip().lower()
        if mode in ("online", "offline", "disabled"):
            init["mode"] = mode
        if kept.get("run_id"):
            init.update(id=kept["run_id"], resume="allow")
        else:
            init["config"] = context.config
        self.run = wandb.init(**init)
        if kept.get("run_id") and context.config:
            self.run.config.update(context.config, allow_val_change=True)  # a resume may change run.steps and overrides
        self.run.define_metric(STEP_KEY)
        self.run.define_metric("*", step_metric=STEP_KEY)
        self.run_id: str = self.run.id
        offline = list(kept.get("offline_dirs") or [])
        if self.run.offline:
            offline.append(str(self.run.sync_dir))
        self.record = {"run_id": self.run.id, "project": project, "entity": entity, "url": self.run.url,
                       "offline_dirs": offline}

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        self.run.log({**scalars, STEP_KEY: step})

    def log_table(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        import wandb

        table = wandb.Table(columns=list(SAMPLE_COLUMNS), data=[[row.get(c) for c in SAMPLE_COLUMNS] for row in rows],
                            allow_mixed_types=True)
        self.run.log({TABLE_KEY: table, STEP_KEY: step})

    def close(self) -> None:
        """Finish the run; where W&B's service is gone (killed), tear down its connection so no exit hook reports it
        again, then raise."""
        import wandb

        try:
            self.run.finish()
        except Exception:
            try:
                wandb.teardown()
            except (Exception, SystemExit):  # noqa: BLE001 - the service is already gone
                pass
            raise
