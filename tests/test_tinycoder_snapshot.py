"""A build's training save as a model directory (``tinycoder.snapshot``: the points of the regime gate's curve against training tokens), the tokens
its steps trained on, and a held-out probe set that leaves out every program the build drafted."""

from __future__ import annotations

import json
import random
from dataclasses import asdict

import pytest
import torch
from transformers import AutoModelForCausalLM

from tinycoder.task_sets import PROBE_SEED, build_drafts, generator_tasks, probe_tasks, seen_tasks, trained_programs
from tinycoder.build import build_model
from tinycoder.cache import MANIFEST
from tinycoder.corpus import corpus_settings_from_dict, draw_programs
from tinycoder.progress import DATA_FILE, PREPARED_DIR, TRAIN_FILE, encoded_from_tensors
from tinycoder.settings import VARIANTS
from tinycoder.shipped import SHIPPED_ROOT
from tinycoder.snapshot import snapshot
from tinycoder.train import SavePolicy, make_batches, tokens_trained
from test_tinycoder_build import MICRO  # 40 programs, 4 steps: seconds
from verifier.sandbox import Verifier


def test_a_training_save_becomes_a_model_directory_with_its_step_and_tokens(tmp_path):
    saves = tmp_path / "progress"
    build_model(MICRO, 0, tmp_path / "built", progress=False, save_dir=saves, save_policy=SavePolicy(every_steps=2))
    state = torch.load(saves / TRAIN_FILE, weights_only=True)
    assert state["step"] == 2

    manifest = snapshot(MICRO, 0, saves, tmp_path / "step-2")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "step-2")
    loaded = model.state_dict()
    assert all(torch.equal(loaded[name], tensor) for name, tensor in state["model"].items())
    assert not all(torch.equal(loaded[name], tensor) for name, tensor in
                   AutoModelForCausalLM.from_pretrained(tmp_path / "built").state_dict().items() if name in state["model"])
    assert json.loads((tmp_path / "step-2" / MANIFEST).read_text())["step"] == manifest["step"] == 2
    assert (tmp_path / "step-2" / "tasks.jsonl").read_text() == (tmp_path / "built" / "tasks.jsonl").read_text()

    data = encoded_from_tensors(torch.load(saves / PREPARED_DIR / DATA_FILE, weights_only=True))
    epoch = len(make_batches(data, MICRO.train.batch_tokens, random.Random(0)))
    assert tokens_trained(data, MICRO.train.batch_tokens, 0, epoch) == sum(len(d.ids) for d in data)  # each once
    assert 0 < manifest["tokens_trained"] == tokens_trained(data, MICRO.train.batch_tokens, 0, 2)

    with pytest.raises(FileExistsError):
        snapshot(MICRO, 0, saves, tmp_path / "step-2")
    with pytest.raises(ValueError, match="it is of build"):
        snapshot(VARIANTS["test"], 0, saves, tmp_path / "other")


def test_corpus_settings_read_back_from_a_manifest():
    for variant in ("default", "stronger-large"):
        corpus = VARIANTS[variant].corpus
        assert corpus_settings_from_dict(json.loads(json.dumps(asdict(corpus)))) == corpus


def test_held_out_probes_leave_out_every_program_the_build_drafted():
    shipped = SHIPPED_ROOT / "default"
    built = json.loads((shipped / MANIFEST).read_text())
    drafted = draw_programs(corpus_settings_from_dict(built["settings"]["corpus"]), random.Random(built["seed"]))
    drafts = {program.source for program, _ in drafted}
    assert build_drafts(shipped)[1] == drafted and len(drafts) == 4000 and drafts <= trained_programs(shipped)
    with Verifier() as verifier:
        probes = probe_tasks(shipped, 30, 4, verifier)
        seed_only = {json.loads(line)["program"] for line in (shipped / "tasks.jsonl").open()}
        before = generator_tasks(verifier, 30, 4, PROBE_SEED, seed_only)  # the rule before: seed tasks only
        seen = seen_tasks(shipped, 30, 4, verifier)
    assert len(probes) == 30 and not {t.program for t in probes} & drafts
    assert len(seen) == 30 and {t.program for t in seen} <= drafts  # the training distribution, beside them
    assert {t.program for t in before} & drafts  # so the old set was not held out
