"""Run directory: metrics log, atomic checkpoints (latest always complete), resume truncation, report plots."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

from checkpoints import checkpoints_to_delete
from reporting.report import write_report
from reporting.run_dir import (RAY_JOB_ENV, RunDirectory, RunDirectoryError, fresh_run_refusal, in_ray_job,
                               resolve_run_dir)
from configs import ConfigError, load_config

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


# ---------------------------------------------------------------------------------------- run directories


def snapshot(directory: Path) -> dict[str, bytes | None]:
    """Every path under ``directory`` with a file's bytes (None for a directory): what "nothing written" compares."""
    return {p.relative_to(directory).as_posix(): (p.read_bytes() if p.is_file() else None)
            for p in sorted(directory.rglob("*"))}


def launch_in_process(*args: str) -> tuple[int, str, bool]:
    """``launch.main(args)`` in a fresh Python: its exit code, stderr, and whether Ray was ever imported."""
    script = ("import sys, launch\ncode = launch.main(sys.argv[1:])\n"
              "print(code, 'ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", script, *args], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "RAY_ADDRESS": "local"})
    code, ray_imported = out.stdout.split()[-2:]
    return int(code), out.stderr, ray_imported == "True"


def hold_a_run(directory: Path, marker: str, checkpoint_steps: tuple[int, ...] = ()) -> None:
    """Leave in ``directory`` what an earlier run leaves: ``marker`` (config.yaml, metrics.jsonl or checkpoints), and
    complete checkpoints ``checkpoint_steps``."""
    directory.mkdir(parents=True, exist_ok=True)
    if marker == "config.yaml":
        (directory / "config.yaml").write_text("run:\n  steps: 40\n")
    elif marker == "metrics.jsonl":
        (directory / "metrics.jsonl").write_text(json.dumps(synthetic_row(1)) + "\n")
    else:
        (directory / "checkpoints").mkdir()
    store = RunDirectory(directory)
    for step in checkpoint_steps:
        store.save_checkpoint(step, lambda d, s=step: (d / "league.json").write_text(json.dumps({"step": s})), keep=10)


@pytest.mark.parametrize("marker", ["config.yaml", "metrics.jsonl", "checkpoints"])
def test_a_fresh_run_into_a_directory_that_holds_a_run_is_refused_before_anything(tmp_path, marker):
    held = tmp_path / "earlier"
    hold_a_run(held, marker)
    before = snapshot(held)
    code, err, ray_imported = launch_in_process("--run-dir", str(held), "--steps", "2", "model.tiny_variant=test")
    assert code == 2 and not ray_imported, err  # refused before any plan, cluster or actor
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert f"--resume {held}" in err and "--run-dir OTHER_DIR" in err
    # no checkpoint in it: it cannot be resumed, and the message says how to start over
    assert "stopped before its first checkpoint" in err and "cannot be resumed" in err and f"rm -r {held}" in err
    assert snapshot(held) == before  # nothing written


def test_a_longer_earlier_run_is_refused_and_named_resumable(tmp_path):
    held = tmp_path / "long"
    hold_a_run(held, "config.yaml", checkpoint_steps=(10, 20))
    before = snapshot(held)
    code, err, _ = launch_in_process("--run-dir", str(held), "--steps", "3", "model.tiny_variant=test")
    assert code == 2, err
    assert "already holds a run" in err and "latest checkpoint step-20" in err
    assert f"python launch.py --resume {held}" in err and "--run-dir OTHER_DIR" in err
    assert "cannot be resumed" not in err
    assert snapshot(held) == before
    # the dry run says the same (what the run would do), and an empty or absent directory is a fresh run's
    dry, dry_err, _ = launch_in_process("--dry-run", "--run-dir", str(held))
    assert dry == 2 and "already holds a run" in dry_err
    (tmp_path / "empty").mkdir()
    for fresh in (tmp_path / "empty", tmp_path / "absent"):
        assert fresh_run_refusal(fresh) is None


def test_the_driver_refuses_a_fresh_run_into_a_run_too(tmp_path, capsys):
    """``actors.driver.train`` (what studies, benches and the GPU check call) refuses before it writes anything."""
    from actors import driver

    held = tmp_path / "earlier"
    hold_a_run(held, "metrics.jsonl", checkpoint_steps=(5,))
    before = snapshot(held)
    assert driver.train(load_config(None, [f"run.run_dir={held}", "model.tiny_variant=test"]), output="quiet") == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and f"--resume {held}" in err
    assert snapshot(held) == before


def test_retention_keeps_n_of_this_runs_checkpoints_and_never_the_latest():
    assert checkpoints_to_delete([1, 2, 3, 4, 5], latest=5, keep=2) == [1, 2, 3]
    assert checkpoints_to_delete([1, 2, 3, 4, 5], latest=5, keep=3) == [1, 2]
    assert checkpoints_to_delete([5], latest=5, keep=1) == []
    assert checkpoints_to_delete([3, 4, 5], latest=5, keep=1) == [3, 4]
    # checkpoints past the latest (a damaged one a resume skipped) are not this run's newest: they never push it out
    assert checkpoints_to_delete([5, 6, 10, 20], latest=6, keep=2) == []
    assert checkpoints_to_delete([5, 6, 7, 10, 20], latest=7, keep=1) == [5, 6]
    assert checkpoints_to_delete([10, 20], latest=1, keep=1) == []  # the latest is not even listed yet: kept
    with pytest.raises(ValueError, match="at least 1"):
        checkpoints_to_delete([1], latest=1, keep=0)


def test_save_checkpoint_keeps_n_and_the_latest_even_beside_later_steps(tmp_path):
    run = RunDirectory(tmp_path / "run")
    write = lambda s: (lambda d: (d / "league.json").write_text(json.dumps({"step": s})))  # noqa: E731
    for step in range(1, 6):
        run.save_checkpoint(step, write(step), keep=3)
    assert sorted(p.name for p in run.checkpoints.glob("step-*")) == ["step-3", "step-4", "step-5"]
    # later steps than the one just written (a resume from step-5 past a damaged step-20): the new one stays the latest
    for step in (20, 30):
        run.save_checkpoint(step, write(step), keep=10)
    (run.checkpoints / "latest").write_text("step-5")
    run.save_checkpoint(6, write(6), keep=2)
    assert run.latest_checkpoint_name() == "step-6" and (run.checkpoints / "step-6" / "league.json").is_file()
    assert sorted(p.name for p in run.checkpoints.glob("step-*")) == ["step-20", "step-30", "step-5", "step-6"]
    assert run.latest_checkpoint().name == "step-6"


@pytest.mark.parametrize("value", [0, -1])
def test_keep_checkpoints_is_at_least_one_at_load(value):
    assert load_config().run.keep_checkpoints == 2
    assert load_config(None, ["run.keep_checkpoints=5"]).run.keep_checkpoints == 5
    with pytest.raises(ConfigError, match="run.keep_checkpoints"):
        load_config(None, [f"run.keep_checkpoints={value}"])


def test_run_directories_resolve_under_run_root_in_a_ray_job_and_as_given_elsewhere(tmp_path):
    now = datetime(2026, 11, 29, 3, 4, 5)
    home = {"HOME": str(tmp_path / "home")}
    job_env = {**home, RAY_JOB_ENV: "{}"}
    plain = tmp_path / "checkout"
    copy = tmp_path / "ray" / "session_x" / "runtime_resources" / "working_dir_files" / "_ray_pkg_abc"
    assert not in_ray_job(home, plain)
    assert in_ray_job(job_env, plain) and in_ray_job(home, copy)
    # launched directly: relative to the current directory, the default under ./runs
    assert resolve_run_dir(Path("runs/a"), "tiny", None, home, plain, now) == plain / "runs" / "a"
    assert resolve_run_dir(None, "tiny", None, home, plain, now) == plain / "runs" / "tiny-20261129-030405"
    assert resolve_run_dir(None, "tiny", Path("/data/runs"), home, plain, now) == Path("/data/runs/tiny-20261129-030405")
    # under `ray job submit`: never in Ray's copy of the working directory
    for env, cwd in ((job_env, plain), (home, copy)):
        assert resolve_run_dir(None, "tiny", None, env, cwd, now) == tmp_path / "home" / "populora-runs" / "tiny-20261129-030405"
        assert resolve_run_dir(Path("a"), "tiny", None, env, cwd, now) == tmp_path / "home" / "populora-runs" / "a"
        assert resolve_run_dir(Path("a"), "tiny", Path("/shared/runs"), env, cwd, now) == Path("/shared/runs/a")
        assert resolve_run_dir(Path("/abs/run"), "tiny", Path("/shared/runs"), env, cwd, now) == Path("/abs/run")
        with pytest.raises(RunDirectoryError, match="absolute run.root"):
            resolve_run_dir(None, "tiny", Path("rel"), env, cwd, now)
    assert resolve_run_dir(Path("~/r"), "tiny", None, home, plain, now) == tmp_path / "home" / "r"
