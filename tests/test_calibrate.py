"""planning/calibrate.py measures a node's constants into a file; the dry run plans with those that describe it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from configs import load_config
from planning.constants_file import (ConstantsFileError, installed_versions, model_digest, node_constants,
                                     read_constants_file, write_constants_file)
from planning.memory_plan import load_model_dims
from planning.time_constants import DEVICE_KINDS, HOST

ROOT = Path(__file__).resolve().parents[1]
SHRUNK = ["--repeats", "1", "--rows", "3", "--new", "4", "--prompt", "16", "--train-seqs", "4", "--train-prompt", "20",
          "--train-completion", "8", "--verifier-tasks", "20"]
PRESET_7B = ROOT / "configs" / "qwen2.5-7b-4t4s.yaml"


def run(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "RAY_ADDRESS": "local"}  # never a cluster running on the machine
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def test_calibrate_measures_the_tiny_model_and_the_dry_run_plans_with_it(tmp_path):
    out = tmp_path / "node.yaml"
    done = run("-m", "planning.calibrate", "--out", str(out), *SHRUNK, "model.tiny_variant=test")
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    node = read_constants_file(out)
    assert node.provenance["kind"] == "cpu" and node.provenance["engine"] == "hf"
    assert node.provenance["versions"]["torch"] == installed_versions()["torch"]
    assert "planning.calibrate" in node.provenance["command"] and node.provenance["model"]["path"] == "tiny"
    expected = {f"cpu.{n}" for n in ("peak_flops", "train_mfu", "memory_bandwidth", "decode_mfu", "prefill_mfu",
                                     "lora_decode_overhead")}
    expected |= {f"host.{n}" for n in ("verifier_tasks_per_core_s", "adapter_load_bandwidth", "adapter_swap_s",
                                       "checkpoint_bandwidth", "league_s", "evolution_s_floor")}
    assert set(node.constants) == expected == set(summary["constants"])
    assert all(v > 0 for k, v in node.constants.items() if k not in ("cpu.lora_decode_overhead", "host.adapter_swap_s"))

    config = load_config(None, ["model.tiny_variant=test"])
    applied = node_constants(node, DEVICE_KINDS, HOST, plan_kind="cpu",
                             digest=model_digest(load_model_dims(config), config.model.dtype), engine="hf")
    assert not applied.ignored and set(applied.used) == expected
    for sourced in (applied.kinds["cpu"].decode_mfu, applied.kinds["cpu"].train_mfu, applied.host.league_s,
                    applied.host.verifier_tasks_per_core_s):
        assert sourced.measured and str(out) in sourced.source

    dry = run("launch.py", "--dry-run", "--constants", str(out), "model.tiny_variant=test")
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert f"constants from {out} (measured on " in dry.stdout and "12 used" in dry.stdout
    assert "ignored" not in dry.stdout and "time: step ~" in dry.stdout


def seven_b(tmp_path: Path):
    """The 7B preset over a config.json of Qwen2.5-7B's shape (no weights: the plan reads only the widths)."""
    from bench import qwen25_7b

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(qwen25_7b.config_json()))
    config = load_config(PRESET_7B, [f"model.path={model}"])
    return config, model_digest(load_model_dims(config), config.model.dtype)


def provenance(kind: str, digest: str, engine: str = "vllm", **versions: str | None) -> dict:
    return {"device": f"NVIDIA {kind}", "kind": kind, "engine": engine,
            "versions": {**installed_versions(), **versions}, "model": {"path": "/models/m", "digest": digest},
            "date": "2026-11-27T00:00:00+00:00", "command": "python -m planning.calibrate --out node.yaml"}


def test_constants_of_another_model_kind_or_version_are_ignored_with_why(tmp_path):
    config, digest = seven_b(tmp_path)

    def apply(name: str, constants: dict, prov: dict):
        node = read_constants_file(write_constants_file(tmp_path / name, constants, prov))
        return node_constants(node, DEVICE_KINDS, HOST, plan_kind="H100", digest=digest, engine="vllm",
                              installed={"torch": "2.9.0", "transformers": "4.57.1", "vllm": "0.11.0"})

    other_kind = apply("a100.yaml", {"A100.train_mfu": 0.5, "host.league_s": 0.01},
                       provenance("A100", digest, torch="2.9.0", vllm="0.11.0"))
    assert other_kind.ignored == {"A100.train_mfu": "measured on A100; the plan is for H100"}
    assert other_kind.host.league_s.value == 0.01 and other_kind.host.league_s.measured

    other_version = apply("versions.yaml", {"H100.train_mfu": 0.5, "H100.decode_mfu": 0.2, "host.checkpoint_bandwidth": 1e9},
                          provenance("H100", digest, torch="2.8.0", vllm="0.10.1"))
    assert other_version.ignored["H100.train_mfu"] == "measured with torch 2.8.0, 2.9.0 is installed here"
    assert set(other_version.ignored) == {"H100.train_mfu", "H100.decode_mfu"} and other_version.used == {
        "host.checkpoint_bandwidth": 1e9}
    assert other_version.kinds["H100"].train_mfu == DEVICE_KINDS["H100"].train_mfu  # the committed value stays

    other_engine = apply("hf.yaml", {"H100.train_mfu": 0.5, "H100.decode_mfu": 0.2, "host.adapter_load_bandwidth": 1e9},
                         provenance("H100", digest, engine="hf", torch="2.9.0"))
    assert other_engine.used == {"H100.train_mfu": 0.5}
    assert other_engine.ignored["H100.decode_mfu"] == "measured with the hf engine; the config generates with vllm"

    # another model, through the dry run as a user runs it: one line per ignored constant, the rest used
    path = write_constants_file(tmp_path / "other-model.yaml",
                                {"H100.train_mfu": 0.5, "host.evolution_s_floor": 0.1, "host.verifier_tasks_per_core_s": 300},
                                provenance("H100", "0123456789abcdef"))
    dry = run("launch.py", "--dry-run", "--config", str(PRESET_7B), "--constants", str(path),
              f"model.path={config.model.path}")
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert "1 used, 2 ignored" in dry.stdout
    for key in ("H100.train_mfu", "host.evolution_s_floor"):
        assert f"  ignored {key}: measured for another model (digest 0123456789abcdef, /models/m; the config's is {digest})" in dry.stdout


def test_a_malformed_constants_file_is_an_error_naming_it(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("populora_constants: 1\nconstants: {H100.no_such: 1}\n")
    with pytest.raises(ConstantsFileError, match="bad.yaml"):
        read_constants_file(bad)
    bad.write_text("constants: [")
    dry = run("launch.py", "--dry-run", "--constants", str(bad))
    assert dry.returncode == 2
    assert f"time: not planned: constants file {bad}: is not YAML" in dry.stdout
