"""Run directory: metrics log, atomic checkpoints (latest always complete), resume truncation, report plots."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from reporting.report import write_report
from reporting.run_dir import RunDirectory
from configs import load_config

ROOT = Path(__file__).resolve().parents[1]


def synthetic_row(step: int) -> dict:
    """A metrics row with the documented keys (values are synthetic: this tests plumbing, not learning)."""
    members = [
        {"id": "t0", "role": "teacher", "mu": 25 + step, "sigma": 8 - 0.1 * step, "parent": None},
        {"id": "s0", "role": "student", "mu": 25 - step, "sigma": 8 - 0.1 * step, "parent": None},
    ]
    evolution = []
    if step == 3:
        members.append({"id": "s1", "role": "student", "mu": 24.0, "sigma": 4.0, "parent": ["s0"]})
        evolution.append({"step": 3, "child": "s1", "parents": ["s0"], "operator": "gaussian_noise", "replaced": "s0"})
    return {
        "step": step, "members": members, "valid_rate": 0.5, "solve_rate": 0.1 * step,
        "teacher_reward": 0.1, "student_reward": -0.2, "program_ast_depth": 3 + step, "program_cyclomatic": 1.5,
        "program_loc": 4.0, "program_variables": 2.0, "coverage": 10 * step,
        "phase_seconds": {"match": 0.1, "propose": 1, "validate": 0.2, "solve": 2, "update": 1}, "evolution": evolution,
    }


def test_checkpoints_are_atomic_and_latest_is_complete(tmp_path):
    run = RunDirectory(tmp_path / "run")
    run.create(load_config())
    assert (run.root / "config.yaml").is_file()
    for step in (1, 2, 3):
        run.save_checkpoint(step, lambda d, s=step: (d / "league.json").write_text(json.dumps({"step": s})))
    assert run.latest_checkpoint().name == "step-3"
    assert sorted(p.name for p in run.checkpoints.glob("step-*")) == ["step-2", "step-3"]

    def crash(d: Path) -> None:
        (d / "half.json").write_text("{")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run.save_checkpoint(4, crash)
    assert run.latest_checkpoint().name == "step-3"  # an interrupted write never becomes the latest
    assert json.loads((run.latest_checkpoint() / "league.json").read_text()) == {"step": 3}


def test_metrics_append_truncate_and_survive_a_cut_line(tmp_path):
    run = RunDirectory(tmp_path)
    for step in range(1, 6):
        run.append_metrics({**synthetic_row(step), "proposals": [{"member": "t0", "valid": True}, {"member": "t0", "valid": False}]})
    run.close()
    assert [r["step"] for r in run.read_metrics()] == [1, 2, 3, 4, 5]
    assert "proposals" not in run.read_metrics()[0]  # the records go to their own file, one line each
    assert [r["step"] for r in run.read_side("proposals")] == [1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    run.truncate_metrics(3)
    assert [r["step"] for r in run.read_metrics()] == [1, 2, 3]
    assert [r["step"] for r in run.read_side("proposals")] == [1, 1, 2, 2, 3, 3]
    with open(run.metrics_path, "a") as handle:
        handle.write('{"step": 4, "cut')
    assert [r["step"] for r in run.read_metrics()] == [1, 2, 3]
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


def test_report_writes_plots_and_compares_two_runs(tmp_path):
    runs = []
    for name in ("population", "single"):
        run = RunDirectory(tmp_path / name)
        for step in range(1, 6):
            run.append_metrics(synthetic_row(step))
        run.close()
        runs.append(run.root)
    written = write_report(runs)
    names = sorted(p.name for p in written)
    assert names == ["compare.png", "complexity.png", "coverage.png", "lineage.png", "rates.png", "ratings.png", "summary.md"]
    for path in (p for p in written if p.suffix == ".png"):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


def test_report_cli_errors_on_a_missing_run(tmp_path):
    out = subprocess.run([sys.executable, "-m", "reporting", str(tmp_path / "nope")], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "does not exist" in out.stderr
