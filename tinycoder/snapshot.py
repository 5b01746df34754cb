"""A build's training save as a model directory: the points of a curve of the gates against training tokens.

A build saves its training state every 120 s (``tinycoder.progress``); ``train.pt`` is overwritten each time, so a
curve keeps copies of it (any ``TrainState`` file of the build). :func:`snapshot` turns one into a plain Hugging
Face model directory, as a finished build writes it (``tinycoder.build.write_model``), plus a manifest saying which
step and how many training tokens it is. A save's weights are the model mid-schedule: its learning rate has not
decayed yet, so a save is not the model a shorter build (with its own schedule) would make.

    python -m tinycoder snapshot --variant stronger-large --save runs/curve/train-4500.pt --out runs/curve/step-4500
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from tinycoder.build import write_model
from tinycoder.cache import MANIFEST, cache_key
from tinycoder.model import new_model
from tinycoder.progress import TRAIN_FILE, BuildProgress
from tinycoder.settings import BuildSettings, data_seed, describe, resolve_precision
from tinycoder.train import tokens_trained


def snapshot(settings: BuildSettings, seed: int, progress_dir: Path, out_dir: Path, save: Path | None = None) -> dict[str, Any]:
    """Write the training save ``save`` (default: ``progress_dir/train.pt``) of the build of ``settings`` and ``seed``
    as a model directory ``out_dir``, from the build's saved corpus and prepared files in ``progress_dir``
    (``tinycoder.progress.BuildProgress`` reads them); returns the manifest it wrote (``step``, ``steps``,
    ``tokens_trained``, ``epochs``, the mean loss of its last 20 steps). For a continuation (``BuildSettings.continues``)
    the tokens and epochs are this build's own steps', the ``continues`` entry says of which model."""
    out_dir = Path(out_dir)
    settings = replace(settings, train=resolve_precision(settings.train))
    described = describe(settings, seed)
    saves = BuildProgress(Path(progress_dir), cache_key(described), described)
    try:
        state = saves.load_train(save)
    except ValueError as error:  # a save of another build
        raise ValueError(f"{save or saves.directory / TRAIN_FILE}: {error}") from None
    corpus, data = saves.load_corpus(), saves.load_data()
    out_dir.mkdir(parents=True, exist_ok=False)
    tokenizer = saves.restore_prepared(out_dir)
    model = new_model(settings.model, tokenizer)
    model.load_state_dict(state.model)
    write_model(model, tokenizer, corpus, settings, seed, out_dir)
    tokens = tokens_trained(data, settings.train.batch_tokens, data_seed(settings, seed), state.step)
    manifest = {
        "name": "tiny-coder", "snapshot_of": saves.key, "seed": seed, "settings": asdict(settings),
        "continues": described["settings"].get("continues"), "step": state.step, "steps": settings.train.steps, "tokens_trained": tokens,
        "epochs": round(tokens / sum(len(d.ids) for d in data), 3),
        "loss_last_20": sum(state.losses[-20:]) / len(state.losses[-20:]), "train_s": state.train_s,
    }
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return manifest
