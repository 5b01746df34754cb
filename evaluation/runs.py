"""What an evaluation reads from run directories: the checkpoint, its members' adapter directories,
the run's configuration and base model. Read only: nothing here writes to a run, model or data dir.

Checkpoint layout (``checkpoints``): ``RUN_DIR/checkpoints/step-N/learners/<i>/adapters/<member>/``
holds one PEFT adapter directory per member; ``RUN_DIR/checkpoints/latest`` names the newest.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from configs import Config, load_config
from planning.model_files import ModelPathError, model_directory


class RunDirError(ValueError):
    """A run directory without the checkpoint or files an evaluation needs."""


@dataclass(frozen=True)
class Member:
    name: str
    path: Path
    rank: int


def checkpoint_dir(run_dir: Path, step: int | None) -> Path:
    """``checkpoints/step-<step>``, or the latest complete checkpoint."""
    root = run_dir / "checkpoints"
    if step is not None:
        path = root / f"step-{step}"
        if not path.is_dir():
            have = sorted(p.name for p in root.glob("step-*")) if root.is_dir() else []
            raise RunDirError(f"{run_dir}: no checkpoint step-{step} (have: {', '.join(have) or 'none'})")
        return path
    pointer = root / "latest"
    if pointer.is_file() and (root / pointer.read_text().strip()).is_dir():
        return root / pointer.read_text().strip()
    steps = sorted(root.glob("step-*"), key=lambda p: int(p.name.split("-")[1])) if root.is_dir() else []
    if not steps:
        raise RunDirError(f"{run_dir}: no checkpoint under {root}")
    return steps[-1]


def members(checkpoint: Path) -> list[Member]:
    """Every member's adapter directory in a checkpoint (sorted by name)."""
    found: list[Member] = []
    for config in sorted(checkpoint.glob("learners/*/adapters/*/adapter_config.json")):
        rank = int(json.loads(config.read_text()).get("r", 0))
        found.append(Member(config.parent.name, config.parent, rank))
    if not found:
        raise RunDirError(f"{checkpoint}: no adapters (expected learners/<i>/adapters/<member>/adapter_config.json)")
    return sorted(found, key=lambda m: m.name)


def run_config(run_dir: Path) -> Config:
    path = run_dir / "config.yaml"
    if not path.is_file():
        raise RunDirError(f"{run_dir}: no config.yaml (not a run directory?)")
    return load_config(path)


def model_path(config: Config) -> Path:
    """The base model directory of a run (the built-in tiny model is built and cached if needed; a Hub id is its
    snapshot in the local cache)."""
    if config.model.path == "tiny":
        from tinycoder import ensure_model

        return Path(ensure_model(variant=config.model.tiny_variant, seed=0, progress=False)).resolve()
    try:
        path = model_directory(config.model.path)
    except ModelPathError as err:
        raise RunDirError(str(err)) from None
    if not (path / "config.json").is_file():
        raise RunDirError(f"model.path={config.model.path!r} is not a local model directory with a config.json")
    return path.resolve()
