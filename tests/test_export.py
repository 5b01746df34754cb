"""``python -m evaluation.export``: a member of a real run (the shared short run, whose learners wrote the
checkpoint) exported as a PEFT directory that loads on its named base in a fresh process with the learner's
log-probs, merged into a full model with the adapter-applied logits, refused where the checkpoint is damaged, and
filling in the base of a checkpoint written before adapters named it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from checkpoints import MANIFEST, tree_digests
from evaluation.export import export_member, main, standings
from evaluation.runs import RunDirError, checkpoint_dir, members, model_path, run_config
from planning.model_files import base_model_name

TEXT = "def f(xs):\n    return [x * 2 for x in xs]\n"


@pytest.fixture(scope="module")
def run(short_run, tmp_path_factory) -> Path:
    """A copy of the shared short run whose adapters' B factors are pushed away from their near-zero start (two
    steps move them by less than the tolerances below), with the checkpoint's manifest rewritten to match."""
    from safetensors.torch import load_file, save_file

    assert short_run.returncode == 0, short_run.stderr[-3000:]
    copy = tmp_path_factory.mktemp("export") / "run"
    shutil.copytree(short_run.run_dir, copy)
    checkpoint = checkpoint_dir(copy, None)
    generator = torch.Generator().manual_seed(0)
    for weights in sorted(checkpoint.glob("learners/*/adapters/*/adapter_model.safetensors")):
        state = load_file(weights)
        for key, value in state.items():
            if "lora_B" in key:
                state[key] = value + 0.05 * torch.randn(value.shape, generator=generator, dtype=value.dtype)
        save_file(state, weights)
    rewrite_manifest(checkpoint)
    return copy


def rewrite_manifest(checkpoint: Path) -> None:
    manifest = json.loads((checkpoint / MANIFEST).read_text())
    manifest["files"] = {k: v for k, v in tree_digests(checkpoint).items() if k != MANIFEST}
    (checkpoint / MANIFEST).write_text(json.dumps(manifest))


def learner_logprobs(base_dir: Path, adapter: Path, config) -> torch.Tensor:
    """Per-token log-probs of ``TEXT`` with the adapter loaded into the learners' own multi-LoRA model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from learners.multi_lora import LoRASpec, MultiLoRAModel
    from learners.peft_io import load_adapter

    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    model = MultiLoRAModel(AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32),
                           LoRASpec(rank=config.lora.rank, alpha=config.lora.alpha, num_slots=1,
                                    target_modules=tuple(config.lora.target_modules)))
    load_adapter(model, 0, adapter)
    ids = torch.tensor([tokenizer(TEXT)["input_ids"]])
    with torch.no_grad():
        logits = model(ids, adapter_index=[0]).logits.float()
    return torch.log_softmax(logits[0, :-1], -1).gather(-1, ids[0, 1:, None])[:, 0]


def learner_logprobs_base(base_dir: Path) -> torch.Tensor:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ids = torch.tensor([AutoTokenizer.from_pretrained(base_dir)(TEXT)["input_ids"]])
    with torch.no_grad():
        logits = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)(ids).logits.float()
    return torch.log_softmax(logits[0, :-1], -1).gather(-1, ids[0, 1:, None])[:, 0]


FRESH = """
import json, sys, torch
from peft import AutoPeftModelForCausalLM
from transformers import AutoTokenizer
adapter = sys.argv[1]
base = json.load(open(adapter + "/adapter_config.json"))["base_model_name_or_path"]
model = AutoPeftModelForCausalLM.from_pretrained(adapter, dtype=torch.float32).eval()
ids = torch.tensor([AutoTokenizer.from_pretrained(base)(sys.argv[2])["input_ids"]])
with torch.no_grad():
    logits = model(ids).logits.float()
print(json.dumps(torch.log_softmax(logits[0, :-1], -1).gather(-1, ids[0, 1:, None])[:, 0].tolist()))
"""


def test_export_loads_on_its_named_base_in_a_fresh_process(run, tmp_path):
    config = run_config(run)
    checkpoint = checkpoint_dir(run, None)
    base_dir = model_path(config)
    # every adapter the learners wrote names the real base, not their temporary copy in /dev/shm
    for member in members(checkpoint):
        named = json.loads((member.path / "adapter_config.json").read_text())["base_model_name_or_path"]
        assert named == base_model_name(config, str(base_dir)) == str(base_dir)

    done = export_member(run, out=tmp_path / "export")
    table = standings(checkpoint)
    solvers = [s for s in table.values() if s.role in ("student", "agent")]
    assert done.member == max(solvers, key=lambda s: s.conservative).name
    card = (tmp_path / "export" / "README.md").read_text()
    assert f"base model: `{base_dir}`" in card and f"step {done.step}" in card and "TrueSkill" in card
    assert done.serve.startswith(f"vllm serve {base_dir} --enable-lora --lora-modules {done.member}=")

    fresh = subprocess.run([sys.executable, "-c", FRESH, str(done.adapter), TEXT], capture_output=True, text=True,
                           timeout=300, cwd=tmp_path)  # a fresh process, outside the checkout
    assert fresh.returncode == 0, fresh.stderr[-2000:]
    theirs = torch.tensor(json.loads(fresh.stdout.strip().splitlines()[-1]))
    ours = learner_logprobs(base_dir, checkpoint_dir(run, None) / next(
        str(m.path.relative_to(checkpoint)) for m in members(checkpoint) if m.name == done.member), config)
    assert torch.allclose(theirs, ours, atol=1e-4), (theirs - ours).abs().max()
    without = learner_logprobs_base(base_dir)
    assert (without - ours).abs().max() > 1e-2  # the adapter matters: the comparison is not of two bases


def test_merged_model_equals_the_adapter_applied_model(run, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    done = export_member(run, member="best", out=tmp_path / "export", do_merge=True)
    base_dir = model_path(run_config(run))
    ids = torch.tensor([AutoTokenizer.from_pretrained(done.merged)(TEXT)["input_ids"]])
    applied = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32), done.adapter)
    merged = AutoModelForCausalLM.from_pretrained(done.merged, dtype=torch.float32)
    with torch.no_grad():
        want, got = applied(ids).logits, merged(ids).logits
    assert torch.allclose(want, got, atol=1e-4), (want - got).abs().max()
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    with torch.no_grad():
        assert not torch.allclose(base(ids).logits, got, atol=1e-4)  # the adapter changed something


def modes(root: Path) -> dict[str, int]:
    """The permission bits of every file and directory under ``root`` (``root`` itself too)."""
    return {str(p.relative_to(root)): p.stat().st_mode & 0o777 for p in [root, *root.rglob("*")]}


def test_checkpoints_have_the_mode_the_umask_gave_the_run(short_run):
    """The shared short run's checkpoints (its learners wrote the adapters, optimizer states, league and lineage) have
    the modes a new file and directory get under the umask the run had (the suite's)."""
    umask = os.umask(0)
    os.umask(umask)
    found = modes(short_run.run_dir / "checkpoints")
    wrong = {k: oct(v) for k, v in found.items()
             if v != (0o777 if (short_run.run_dir / "checkpoints" / k).is_dir() else 0o666) & ~umask}
    assert len(found) > 10 and not wrong, wrong


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_exports_adapters_and_merged_models_get_the_mode_the_umask_gives(run, tmp_path, umask):
    """An export (adapter, card, merged model) and an adapter a learner saves have the modes a new file and a new
    directory get under the user's umask: readable by the group and others under 022, by the user alone under 077."""
    from learners.multi_lora import LoRASpec, MultiLoRAModel
    from learners.peft_io import save_adapter
    from transformers import AutoModelForCausalLM

    base_dir = model_path(run_config(run))
    previous = os.umask(umask)
    try:
        done = export_member(run, member="best", out=tmp_path / "export", do_merge=True)
        model = MultiLoRAModel(AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32),
                               LoRASpec(rank=2, alpha=4, num_slots=1))
        saved = save_adapter(model, 0, tmp_path / "saved")
    finally:
        os.umask(previous)
    for root in (done.out, saved):
        found = modes(root)
        wrong = {k: oct(v) for k, v in found.items() if v != (0o777 if (root / k).is_dir() else 0o666) & ~umask}
        assert len(found) > 2 and not wrong, (oct(umask), wrong)
    assert (done.merged / "config.json").is_file() and (done.adapter / "adapter_model.safetensors").is_file()


def test_unknown_members_damaged_checkpoints_and_taken_outputs_are_refused(run, tmp_path, capsys):
    have = [m.name for m in members(checkpoint_dir(run, None))]
    assert main([str(run), "--member", "nobody", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "no member 'nobody'" in err and all(name in err for name in have)
    assert main([str(run), "--checkpoint", "999", "--out", str(tmp_path / "y")]) == 2
    assert "no checkpoint step-999" in capsys.readouterr().err

    damaged = tmp_path / "damaged"
    shutil.copytree(run, damaged)
    weights = next(checkpoint_dir(damaged, None).glob("learners/*/adapters/*/adapter_model.safetensors"))
    weights.write_bytes(weights.read_bytes()[:-8])
    with pytest.raises(RunDirError, match=weights.name):
        export_member(damaged, out=tmp_path / "z")
    assert not (tmp_path / "z").exists()

    export_member(run, out=tmp_path / "taken")
    with pytest.raises(RunDirError, match="not empty"):
        export_member(run, out=tmp_path / "taken")


def test_an_older_checkpoint_gets_its_base_from_the_runs_config(run, tmp_path):
    """Adapters written before this change named the learners' temporary base copy; the export names the real one
    (the checkpoint's manifest is rewritten here as such a run wrote it)."""
    old = tmp_path / "old"
    shutil.copytree(run, old)
    checkpoint = checkpoint_dir(old, None)
    for path in checkpoint.glob("learners/*/adapters/*/adapter_config.json"):
        settings = json.loads(path.read_text())
        settings["base_model_name_or_path"] = "/dev/shm/populora-base-0123456789abcdef"
        path.write_text(json.dumps(settings))
    rewrite_manifest(checkpoint)
    done = export_member(old, out=tmp_path / "export")
    named = json.loads((done.adapter / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert named == str(model_path(run_config(old)))
