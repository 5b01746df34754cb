"""A build's training save as a model directory: the points of a curve of the gates against training tokens (issue 64).

A build saves its training state every 120 s (``tinycoder.progress``); ``train.pt`` is overwritten each time, so a
curve keeps copies of it (any ``TrainState`` file of the build). :func:`snapshot` turns one into a plain Hugging
Face model directory, as a finished build writes it (``tinycoder.build.write_model``), plus a manifest saying which
step and how many training tokens it is. A save's weights are the model mid-schedule: its learning rate has not
decayed yet, so a save is not the model a shorter build (with its own schedule) would make.

    python -m tinycoder snapshot --variant stronger-large --save runs/curve/train-4500.pt --out runs/curve/step-4500
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer

from tinycoder.build import write_model
from tinycoder.cache import MANIFEST, cache_key
from tinycoder.corpus import VerifiedProgram
from tinycoder.model import new_model
from tinycoder.progress import CORPUS_FILE, DATA_FILE, PREPARED_DIR, TRAIN_FILE, encoded_from_tensors
from tinycoder.settings import BuildSettings, describe, resolve_precision
from tinycoder.train import tokens_trained


def snapshot(settings: BuildSettings, seed: int, progress_dir: Path, out_dir: Path, save: Path | None = None) -> dict[str, Any]:
    """Write the training save ``save`` (default: ``progress_dir/train.pt``) of the build of ``settings`` and ``seed``
    as a model directory ``out_dir``, from the build's saved corpus and prepared files in ``progress_dir``; returns
    the manifest it wrote (``step``, ``steps``, ``tokens_trained``, ``epochs``, the mean loss of its last 20 steps)."""
    progress_dir, out_dir = Path(progress_dir), Path(out_dir)
    settings = replace(settings, train=resolve_precision(settings.train))
    key = cache_key(describe(settings, seed))
    state = torch.load(save or progress_dir / TRAIN_FILE, weights_only=True, map_location="cpu")
    if state.get("key") != key:
        raise ValueError(f"{save or progress_dir / TRAIN_FILE} is a save of build {state.get('key')}, not {key}")
    prepared = progress_dir / PREPARED_DIR
    out_dir.mkdir(parents=True, exist_ok=False)
    for path in prepared.iterdir():
        if path.name != DATA_FILE:
            shutil.copyfile(path, out_dir / path.name)
    tokenizer = AutoTokenizer.from_pretrained(out_dir)
    with (progress_dir / CORPUS_FILE).open() as handle:
        corpus = [VerifiedProgram.from_dict(json.loads(line)) for line in handle]
    model = new_model(settings.model, tokenizer)
    model.load_state_dict(state["model"])
    write_model(model, tokenizer, corpus, settings, seed, out_dir)
    data = encoded_from_tensors(torch.load(prepared / DATA_FILE, weights_only=True))
    tokens = tokens_trained(data, settings.train.batch_tokens, seed, state["step"])
    losses = state["losses"]
    manifest = {
        "name": "tiny-coder", "snapshot_of": key, "seed": seed, "settings": asdict(settings),
        "step": state["step"], "steps": settings.train.steps, "tokens_trained": tokens,
        "epochs": round(tokens / sum(len(d.ids) for d in data), 3),
        "loss_last_20": sum(losses[-20:]) / len(losses[-20:]), "train_s": state["train_s"],
    }
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return manifest
