"""What the system tests share: the overrides of a short run on the tiny `test` model, and how they start `launch.py`."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
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
    "verifier.actors=1",
    "run.dashboard=false",
]
"""Overrides of a run that takes seconds per step: few tasks and rollouts, short answers, evolution every 2 steps,
one verifier actor and no dashboard process (each ~1.5-3 s of CPU per launch on two cores; the shared short run keeps
both as a user gets them, for the terminal and recovery tests)."""


def launch_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a `launch.py` subprocess: Ray on loopback, a local cluster of its own (``RAY_ADDRESS=local``).

    Without RAY_ADDRESS, `launch.py` attaches to a cluster that `ray start` runs on this machine (recorded under
    ``$TMPDIR/ray``; ``actors.cluster.cluster_address``), so a test's run would land on a user's cluster, share its
    resources and fail or pass by what else runs there; ``RAY_ADDRESS=local`` always starts a separate one
    (``extra`` may still name another address)."""
    return {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_ADDRESS": "local", **(extra or {})}


def launch(*args: str, timeout: int = 600, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run `launch.py` with ``args`` to its end in a subprocess (``launch_env``), capturing what it prints."""
    return subprocess.run([sys.executable, "launch.py", *args], cwd=ROOT, env=launch_env(env), capture_output=True,
                          text=True, timeout=timeout)


@dataclass(frozen=True)
class Launched:
    """A finished `launch.py` run that several test files read: its directory and what it printed.
    Tests treat ``run_dir`` as read-only (copy it to change it), since the next test reads it too."""

    run_dir: Path
    returncode: int
    stdout: str
    stderr: str


SHORT_RUN = [*SHORT, "verifier.actors=2", "run.dashboard=true", "rl.teacher_learning_rate=3e-4", "evolution.period=1",
             "rl.kl_readout_every=2"]
"""The shared short run (conftest ``short_run``): ``SHORT`` with a pool of two verifiers, the dashboard a user gets,
teachers at their own learning rate, evolution due every step, which never evolves at a run's last step (the 2-step
run evolves at step 1 only, and resumed to step 3 at step 2), and the KL readout at step 2."""


def launched(run_dir: Path, *args: str) -> Launched:
    done = launch(*args)
    return Launched(run_dir, done.returncode, done.stdout, done.stderr)

