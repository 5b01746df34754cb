"""launch.py as a user runs it: a real subprocess, dry runs, errors before anything starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def launch(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "RAY_ADDRESS": "local", **(env or {})}  # never a cluster running on the machine
    return subprocess.run(
        [sys.executable, "launch.py", *args], cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=120
    )


def test_dry_run_paper_preset_prints_gpu_placement_and_verifier_pool():
    out = launch("--dry-run", "--config", "configs/qwen2.5-7b-4t4s.yaml", env={"POPULORA_MODEL": "/models/q"})
    assert out.returncode == 0, out.stderr
    assert "# placement plan" in out.stdout
    for gpu in range(8):
        assert f"GPU {gpu} " in out.stdout or f"GPU {gpu}\n" in out.stdout
    assert "verifier-0..31 (x32)" in out.stdout
    assert "path: /models/q" in out.stdout


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
