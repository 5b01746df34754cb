"""An interrupted build resumes from its last save or starts clean, saying which in one line, and a resumed build
equals an uninterrupted one bit for bit (``tinycoder.progress``, ``tinycoder.build.build_cached``)."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tinycoder.build import build_cached, build_model
from tinycoder.cache import MANIFEST, cache_key
from tinycoder.corpus import build_corpus
from tinycoder.progress import CORPUS_FILE, PARTIAL_CORPUS_FILE, TRAIN_FILE, BuildProgress, progress_dir_for
from tinycoder.settings import VARIANTS, BuildSettings, describe
from tinycoder.train import SavePolicy
from test_tinycoder_build import MICRO  # 40 programs, 4 steps: seconds
from verifier.sandbox import Verifier

ROOT = Path(__file__).resolve().parents[1]
KILL_STEPS = 30  # the killed build's length: long enough that the kill lands before its end on a busy machine



def short_test_variant(steps: int) -> BuildSettings:
    """The shipped ``test`` variant, float32, with only ``steps`` training steps (the child process builds this too)."""
    test = VARIANTS["test"]
    return replace(test, train=replace(test.train, steps=steps, precision="fp32"))


def key_of(settings: BuildSettings, seed: int = 0) -> str:
    return cache_key(describe(settings, seed))


def start_lines(err: str, key: str) -> list[str]:
    return [line for line in err.splitlines() if f"build {key} from" in line]


def weights(directory: Path) -> dict[str, torch.Tensor]:
    return load_file(directory / "model.safetensors")


def assert_same_build(a: Path, b: Path) -> None:
    """Bit-for-bit equal state dicts, and every other file the build writes equal, but the manifest (timings)."""
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    different = [name for name in wa if wa[name].dtype != wb[name].dtype or not torch.equal(wa[name], wb[name])]
    assert not different, f"tensors differ: {different[:5]}"
    files = sorted(p.name for p in a.iterdir() if p.name != MANIFEST)
    assert files == sorted(p.name for p in b.iterdir() if p.name != MANIFEST)
    assert [n for n in files if (a / n).read_bytes() != (b / n).read_bytes()] == []


CHILD = """
import pickle, sys
from tinycoder.build import build_cached
settings, target, policy = pickle.loads(bytes.fromhex(sys.argv[1]))
build_cached(settings, 0, target, progress=True, threads=1, save_policy=policy)
"""
"""The killed child: a build of the settings, target and save policy it is handed (pickled, as hex, in argv)."""
# saves after every 2 steps, and the test variant's 800 programs verified in chunks of 100 (a save after each)
POLICY = SavePolicy(every_steps=2, corpus_chunk=100)


def build_killed_at(target: Path, file: Path, log: Path) -> None:
    """Build ``target`` in a child process and kill it with SIGKILL as soon as ``file`` exists (the child's stderr
    goes to ``log``)."""
    handed = pickle.dumps((short_test_variant(KILL_STEPS), target, POLICY)).hex()
    with log.open("w") as err:
        child = subprocess.Popen([sys.executable, "-c", CHILD, handed], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + 240
        while not file.is_file() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(child.pid, signal.SIGKILL)  # a real kill, wherever the child is: working, or writing its next save
        child.wait(60)
    assert child.returncode == -signal.SIGKILL, f"the child ended (exit {child.returncode}) before the kill: {log.read_text()[-2000:]}"
    assert not (target / MANIFEST).exists() and file.is_file()


@pytest.mark.slow  # three builds of the test variant's corpus and two child processes: ~1-1.5 min on two busy cores
def test_a_build_killed_in_its_corpus_and_in_training_resumes_to_the_weights_of_an_uninterrupted_one(tmp_path, capfd):
    settings = short_test_variant(KILL_STEPS)
    key = key_of(settings)
    whole = build_cached(settings, 0, tmp_path / "a" / f"test-{key}", progress=False, threads=1, save_policy=POLICY)

    target = tmp_path / "b" / f"test-{key}"
    saves = progress_dir_for(target)
    build_killed_at(target, saves / PARTIAL_CORPUS_FILE, tmp_path / "first.log")
    assert not (saves / CORPUS_FILE).exists(), "the first kill came after the corpus was complete"
    build_killed_at(target, saves / TRAIN_FILE, tmp_path / "second.log")
    lines = start_lines((tmp_path / "second.log").read_text(), key)
    assert len(lines) == 1 and f"resuming build {key} from step 0 of {KILL_STEPS} (the corpus is verified up to program " in lines[0]
    assert len(list(target.parent.glob(f".{target.name}.building-*"))) == 1, "the killed builds' temporary directories"

    capfd.readouterr()
    resumed = build_cached(settings, 0, target, progress=True, threads=1, save_policy=POLICY)
    lines = start_lines(capfd.readouterr().err, key)
    assert len(lines) == 1, lines
    step = int(lines[0].split(f"resuming build {key} from step ")[1].split(" of ")[0])
    assert 2 <= step < KILL_STEPS and f"of {KILL_STEPS} (saved in {saves})" in lines[0]
    assert_same_build(whole, resumed)
    assert not saves.exists() and not list(target.parent.glob(f".{target.name}.building-*"))  # nothing left over
    manifest = json.loads((resumed / MANIFEST).read_text())
    assert manifest["resumed_from_step"] == step and manifest["start"] == lines[0].split("] ", 1)[1]
    first = json.loads((whole / MANIFEST).read_text())
    assert first["start"] == f"starting build {key} from scratch (no usable save: none yet)"
    assert first["resumed_from_step"] is None


def test_resumes_from_a_training_save_or_from_the_saved_corpus_when_the_training_save_is_damaged(tmp_path, capfd):
    key = key_of(MICRO)
    saves = tmp_path / "progress"
    reference = build_model(MICRO, 0, tmp_path / "whole", progress=False)
    build_model(MICRO, 0, tmp_path / "first", progress=False, save_dir=saves, save_policy=SavePolicy(every_steps=2))
    assert (saves / TRAIN_FILE).is_file()  # saved after step 2 of 4 (never after the last step)

    capfd.readouterr()
    build_model(MICRO, 0, tmp_path / "second", progress=True, save_dir=saves, save_policy=SavePolicy(every_steps=2))
    err = capfd.readouterr().err
    assert start_lines(err, key) == [f"[tiny-coder] resuming build {key} from step 2 of 4 (saved in {saves})"]
    # stderr is not a terminal here: progress lines (at least the last step's), no bar redraws
    assert "\r" not in err and "step/s" not in err and "s/step" not in err, err
    assert [line for line in err.splitlines() if line.startswith("[tiny-coder] step 4/4, loss ")], err
    assert_same_build(tmp_path / "whole", tmp_path / "second")

    data = (saves / TRAIN_FILE).read_bytes()
    (saves / TRAIN_FILE).write_bytes(data[: len(data) // 2])  # as a disk that filled up might leave it
    capfd.readouterr()
    build_model(MICRO, 0, tmp_path / "third", progress=True, save_dir=saves, save_policy=SavePolicy(every_steps=3))
    lines = start_lines(capfd.readouterr().err, key)
    assert len(lines) == 1 and f"resuming build {key} from step 0 of 4 (the saved corpus and examples; the training save is unusable" in lines[0]
    assert_same_build(tmp_path / "whole", tmp_path / "third")
    assert reference["final_loss"] == json.loads((tmp_path / "third" / MANIFEST).read_text())["final_loss"]


def test_a_save_of_other_settings_is_not_used_and_one_line_says_so(tmp_path, capfd):
    """A progress directory holding another build's key and corpus (seed 1's) is cleared, never trained on."""
    saves = tmp_path / "progress"
    other = BuildProgress(saves, key_of(MICRO, 1), describe(MICRO, 1))
    assert other.open(MICRO.train.steps, 1).line.startswith("starting build")
    with Verifier(timeout_s=2.0, memory_mb=256) as verifier:
        foreign = build_corpus(verifier, MICRO.corpus, 1)
    other.save_corpus(foreign)
    assert other.load_corpus() == foreign  # the saved corpus reads back equal

    key = key_of(MICRO)
    capfd.readouterr()
    build_model(MICRO, 0, tmp_path / "built", progress=True, save_dir=saves)
    lines = start_lines(capfd.readouterr().err, key)
    assert lines == [f"[tiny-coder] starting build {key} from scratch (no usable save: the save in {saves} is of build "
                     f"{key_of(MICRO, 1)}, not {key} (other settings, seed, generator or prompt formats); not used)"]
    build_model(MICRO, 0, tmp_path / "reference", progress=False)
    assert_same_build(tmp_path / "reference", tmp_path / "built")
    assert BuildProgress(saves, key, {}).load_corpus() != foreign  # this build's own corpus replaced it


def test_a_build_stopped_before_its_corpus_was_saved_starts_clean(tmp_path, capfd):
    saves = tmp_path / "progress"
    key = key_of(MICRO)
    BuildProgress(saves, key, describe(MICRO, 0)).open(MICRO.train.steps, 1)  # what a build killed in its corpus leaves
    (saves / f".{CORPUS_FILE}.tmp-123").write_text('{"half": ')  # a corpus save the kill cut short
    capfd.readouterr()
    build_model(MICRO, 0, tmp_path / "built", progress=True, save_dir=saves)
    assert start_lines(capfd.readouterr().err, key) == [
        f"[tiny-coder] starting build {key} from scratch (no usable save: the last build stopped before its corpus was saved)"]
    assert not list(saves.glob(".*.tmp-*"))


def test_a_corpus_verified_in_chunks_or_resumed_from_a_chunk_keeps_what_one_pass_keeps(tmp_path):
    """``build_corpus(chunk=...)`` and a resume from a chunk's ``PartialCorpus`` (through its saved file) keep the
    same programs as one pass: the draws deciding on constant programs follow draft order, and the saved generator
    state is what keeps them so (a resume with another state keeps other programs)."""
    import random

    settings = replace(MICRO.corpus, programs=120, constant_keep_rate=0.5)  # many constant-program draws
    partials = []
    with Verifier(timeout_s=2.0, memory_mb=256) as verifier:
        whole = build_corpus(verifier, settings, 0)
        assert build_corpus(verifier, settings, 0, chunk=30, on_chunk=partials.append) == whole
        assert [p.drafts_done for p in partials] == [30, 60, 90]
        saves = BuildProgress(tmp_path / "progress", "k", {})
        saves.open(MICRO.train.steps, 1)
        saves.save_partial_corpus(partials[0])
        loaded = saves.load_partial_corpus()
        assert loaded == partials[0]
        assert build_corpus(verifier, settings, 0, chunk=30, resume=loaded) == whole
        assert build_corpus(verifier, settings, 0, resume=partials[1]) == whole
        other_state = replace(partials[0], rng_state=random.Random(1).getstate())
        assert build_corpus(verifier, settings, 0, resume=other_state) != whole
    with pytest.raises(ValueError, match="chunk"):
        build_corpus(verifier, settings, 0, chunk=0)


def test_save_policy_by_steps_and_seconds_never_after_the_last_step():
    by_steps = SavePolicy(every_s=1e9, every_steps=3)
    assert [n for n in range(1, 10) if by_steps.due(n, 9, 0.0)] == [3, 6]
    by_time = SavePolicy(every_s=60)
    assert by_time.due(5, 9, 61.0) and not by_time.due(5, 9, 59.0) and not by_time.due(9, 9, 1e9)
    with pytest.raises(ValueError, match="every_steps"):
        SavePolicy(every_steps=0)
