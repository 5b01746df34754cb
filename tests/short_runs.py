"""What the system tests share: the overrides of a short run on the tiny `test` model, and how they start `launch.py`."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SHORT = [
    "model.tiny_variant=test",
    "tasks.tasks_per_teacher=3",
    "tasks.rollouts_k=2",
    "inference.max_tokens=96",
    "evolution.period=2",
    "evolution.protection_steps=1",
    "run.checkpoint_every=1",
    "verifier.actors=2",
]
"""Overrides of a run that takes seconds per step: few tasks and rollouts, short answers, evolution every 2 steps."""


def launch_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a `launch.py` subprocess: Ray on loopback, a local cluster of its own (no RAY_ADDRESS)."""
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", **(extra or {})}
    env.pop("RAY_ADDRESS", None)
    return env
