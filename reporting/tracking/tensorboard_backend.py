"""TensorBoard: event files in RUN_DIR/tensorboard/ (``tensorboard --logdir runs/``).

A repeated step (a resumed run continues after its checkpoint; a recovery rewinds to it) starts a new event file
with a purge marker at that step (``SummaryWriter(purge_step=...)``: TensorBoard's ``SessionLog.START``): TensorBoard
then hides the points the earlier session wrote at that step and after, so each step shows its latest value once.
"""

from __future__ import annotations

import time
from typing import Any, Mapping, Sequence

from reporting.tracking import SAMPLE_COLUMNS, TrackingContext

DIRECTORY = "tensorboard"


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] = SAMPLE_COLUMNS) -> str:
    """``rows`` as a Markdown table (TensorBoard's text tab renders it): ``|`` escaped, line breaks as ``<br>``."""
    def cell(value: Any) -> str:
        text = "" if value is None else str(value)
        return text.replace("\\", "\\\\").replace("|", "\\|").replace("\r", "").replace("\n", "<br>")

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


class TensorBoardTracker:
    """Scalars with ``add_scalar``, the samples table as Markdown text (tag ``samples``)."""

    name = "tensorboard"
    run_id = None
    record = None

    def __init__(self, context: TrackingContext):
        self.directory = context.root / DIRECTORY
        self.last_step: int | None = None
        self.writer = self._writer(context.start_step)

    def _writer(self, purge_step: int | None) -> Any:
        """A new event file. TensorBoard reads a directory's files in name order, and a file's name is the second
        it was made, the host, the pid and a per-process counter, compared as text (".10" before ".9"): a purging
        file made in the same second as the one before it could be read first, so it waits for the next second
        (only a rewind does, once)."""
        from torch.utils.tensorboard import SummaryWriter

        while int(time.time()) <= getattr(self, "created", -1):
            time.sleep(0.05)
        self.created = int(time.time())
        return SummaryWriter(str(self.directory), purge_step=purge_step)

    def _at(self, step: int) -> None:
        """Before writing ``step``: a step at or before the last one written starts a purge there."""
        if self.last_step is not None and step <= self.last_step:
            self.writer.close()
            self.writer = self._writer(step)
        self.last_step = step

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        self._at(step)
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def log_table(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        self.writer.add_text("samples", markdown_table(rows), step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
