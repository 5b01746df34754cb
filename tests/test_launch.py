"""launch.py as a user runs it: a real subprocess, dry runs, errors before anything starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hub_cache import add_to_cache, cache_env, tiny_model_dir

ROOT = Path(__file__).resolve().parents[1]


def launch(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "RAY_ADDRESS": "local", **(env or {})}  # never a cluster running on the machine
    return subprocess.run(
        [sys.executable, "launch.py", *args], cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=120
    )


def test_dry_run_paper_preset_prints_gpu_placement_and_verifier_pool():
    out = launch("--dry-run", "--config", "configs/qwen2.5-7b-4t4s.yaml", env={"POPULORA_MODEL": "/models/q"})
    # the placement is printed, then the model's config.json cannot be read: exit 2 with one error line
    assert out.returncode == 2, out.stderr
    assert "# placement plan" in out.stdout
    for gpu in range(8):
        assert f"GPU {gpu} " in out.stdout or f"GPU {gpu}\n" in out.stdout
    assert "verifier-0..31 (x32)" in out.stdout
    assert "path: /models/q" in out.stdout
    assert "configuration valid" not in out.stdout and "memory: not planned" in out.stdout
    assert out.stderr.strip().splitlines() == ["error: no config.json in model.path=/models/q: the memory plan needs the "
                                               "model's widths"], out.stderr


def test_a_hub_id_resolves_to_its_snapshot_in_the_local_cache_and_plans(tmp_path):
    cache = tmp_path / "hub"
    snapshot = add_to_cache(cache, "populora-test/tiny-coder", tiny_model_dir())
    out = launch("--dry-run", "model.path=populora-test/tiny-coder", env=cache_env(cache))
    assert out.returncode == 0, out.stderr
    assert "path: populora-test/tiny-coder" in out.stdout  # the run records the id, not the cache's path
    assert "dry run: configuration valid" in out.stdout and "time: step" in out.stdout  # planned from its config.json
    # the driver's own resolution (what the actors load and the shared-path check sees) is the snapshot directory
    resolved = subprocess.run(
        [sys.executable, "-c", "from configs import load_config; from planning.model_files import resolve_model; "
         "print(resolve_model(load_config(None, ['model.path=populora-test/tiny-coder']), progress=False))"],
        cwd=ROOT, env={**os.environ, **cache_env(cache)}, capture_output=True, text=True, timeout=120)
    assert resolved.returncode == 0, resolved.stderr
    assert Path(resolved.stdout.strip()) == snapshot and (snapshot / "config.json").is_symlink()


def test_a_hub_id_missing_from_the_cache_stops_the_dry_run_and_the_run_naming_the_download(tmp_path):
    cache = tmp_path / "hub"
    add_to_cache(cache, "populora-test/other", tiny_model_dir())  # a cache that holds another model
    expected = ("error: model.path=Qwen/Qwen2.5-7B is neither a local directory nor a model in the local Hugging Face "
                f"cache ({cache}); models are never downloaded at run time: download it first with "
                "`hf download Qwen/Qwen2.5-7B`")
    dry = launch("--dry-run", "--config", "configs/qwen2.5-7b-4t4s.yaml", "model.path=Qwen/Qwen2.5-7B",
                 env=cache_env(cache))
    assert dry.returncode == 2 and "# placement plan" in dry.stdout and "configuration valid" not in dry.stdout
    assert len(dry.stderr.strip().splitlines()) == 1 and dry.stderr.startswith(expected), dry.stderr
    run_dir = tmp_path / "run"
    run = launch("--run-dir", str(run_dir), "model.path=Qwen/Qwen2.5-7B", env=cache_env(cache))
    assert run.returncode == 2 and run.stderr.startswith(expected), run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and "connecting" not in run.stdout  # before any cluster or actor
    assert not run_dir.exists()
    # a partial copy in the cache (config.json only) plans, but the run names what is missing and how to complete it
    add_to_cache(cache, "populora-test/partial", tiny_model_dir(), files=["config.json"])
    partial = launch("--run-dir", str(run_dir), "model.path=populora-test/partial", env=cache_env(cache))
    assert partial.returncode == 2 and "`hf download populora-test/partial`" in partial.stderr, partial.stderr
    assert not (run_dir / "config.yaml").exists()  # no run left behind: the same --run-dir takes the next try


def test_dry_run_default_is_tiny_and_valid():
    out = launch("--dry-run", "--steps", "3", "population.teachers=3")
    assert out.returncode == 0, out.stderr
    assert "path: tiny" in out.stdout and "teachers: 3" in out.stdout and "steps: 3" in out.stdout


def test_unknown_key_fails_naming_it():
    out = launch("--dry-run", "nonsense.knob=3")
    assert out.returncode == 2
    assert "nonsense" in out.stderr and "valid keys" in out.stderr
    assert "# placement plan" not in out.stdout


def test_bad_value_fails_naming_it():
    out = launch("--dry-run", "population.teachers=-2")
    assert out.returncode == 2
    assert "population.teachers" in out.stderr


def test_resume_needs_a_run_directory(tmp_path):
    out = launch("--dry-run", "--resume", str(tmp_path))
    assert out.returncode == 2 and "config.yaml" in out.stderr


def test_help_documents_quiet_verbose_and_the_dashboard_login():
    out = launch("--help")
    assert out.returncode == 0
    help_text = " ".join(out.stdout.split())
    assert "--quiet print only errors and the final summary" in help_text
    assert "--verbose forward the actors' output" in help_text
    assert "RUN_DIR/logs/" in help_text and "`ray get-auth-token`" in help_text


def test_quiet_and_verbose_exclude_each_other():
    out = launch("--quiet", "--verbose", "--dry-run")
    assert out.returncode == 2 and "not allowed with argument" in out.stderr


def test_a_dry_run_imports_neither_torch_nor_transformers():
    """The plan and the tiny model's cache key need no tensor library: a dry run starts in about a second (it
    took ~10 s of CPU importing them, on every `launch.py` start)."""
    script = ("import runpy, sys\nsys.argv = ['launch.py', '--dry-run']\n"
              "try:\n    runpy.run_path('launch.py', run_name='__main__')\nexcept SystemExit as stop:\n"
              "    assert not stop.code, stop.code\n"
              "print(sorted(m for m in ('torch', 'transformers', 'peft') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env={**os.environ, "RAY_ADDRESS": "local"},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"
