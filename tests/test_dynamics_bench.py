"""`studies/dynamics.py` as a smoke run (3 steps, one seed, the tiny test model), then what a kept study folder does
on a rerun: finished runs are reused, runs of another study are refused, failed runs are never averaged in."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from short_runs import ROOT, launch_env

COMPLEXITY = ("program_ast_depth", "program_cyclomatic", "program_loc", "program_variables")
OVERRIDES = ["model.tiny_variant=test", "tasks.tasks_per_teacher=3", "tasks.rollouts_k=2", "inference.max_tokens=96",
             "verifier.actors=2"]
CLAIMS = {"population_minus_single_complexity_slope", "single_complexity_down", "population_complexity_up",
          "population_coverage_at_equal_programs_higher", "population_mean_probe_ge_single", "weakest_member_probe_ge_single"}


def bench(folder: Path, *args: str, overrides: list[str] = OVERRIDES) -> subprocess.CompletedProcess:
    """The study on ``folder``, its configs named as docs/dynamics.md's commands name theirs (here the defaults)."""
    cmd = [sys.executable, "-m", "studies.dynamics", "--steps", "3", "--seeds", "1", "--probes", "3", "--samples", "1",
           "--population-config", "configs/tiny.yaml", "--single-config", "configs/tiny-single.yaml",
           "--keep", str(folder), *args, *overrides]
    return subprocess.run(cmd, cwd=ROOT, env=launch_env(), capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    folder = tmp_path_factory.mktemp("dynamics") / "study"
    return folder, bench(folder, "--jobs", "2")


def test_smoke_study_reports_every_claim(study):
    folder, done = study
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(result["verdicts"]) == CLAIMS
    assert set(result["verdicts"].values()) == {"inconclusive"} and not result["powered"]  # one seed: nothing quoted
    assert set(result["unpowered"]) == CLAIMS
    assert set(result["comparisons"]["population_minus_single_complexity_slope"]) == set(COMPLEXITY)
    for arm in ("population", "single"):  # every proposal recorded with its reward and advantage
        records = [json.loads(line) for line in (folder / arm / "seed-0" / "proposals.jsonl").read_text().splitlines()]
        assert {r["step"] for r in records} == {1, 2, 3} and all("advantage" in r and "reward" in r for r in records)
        window = result["complexity_payoff"][arm]["windows"][0]
        assert set(window["pair_shares"]) == {"invalid_vs_valid", "unsolved_vs_solved", "solved_vs_solved", "same_class"}
        assert {"advantage_per_line", "advantage_per_line_sequence", "reward_per_line"} <= set(window)
        assert result[arm]["seed_ids"] == [0]
    assert result["comparisons"]["probe_population_mean_minus_single"]["tasks"] == 3
    assert result["comparisons"]["probe_weakest_member_minus_single_weakest_of_n"]["single_draws"] == 2  # 2 students
    assert result["comparisons"]["coverage_at_equal_programs"]["programs"] > 0
    assert "with sequence weights" in done.stderr and "reward by lines of code" in done.stderr
    assert "students' solve rate by lines of code" in done.stderr and "readouts, first -> last" in done.stderr
    for arm in ("population", "single"):  # whether bigger is harder, and how far the adapters moved
        window = result["complexity_payoff"][arm]["windows"][0]
        assert set(window["solve_by_bin"]) == {"loc", "ast_depth"}  # (the test model may write no valid task)
        assert result[arm]["metrics"]["student_update_norm"]["first"] is not None
    assert "written programs (each arm)" in done.stderr and "weakest of 2 single-agent draws" in done.stderr
    assert result["seeds"] == {"population": 1, "single": 1} and result["failed_runs"] == []
    for arm in ("population", "single"):
        metrics = result[arm]["metrics"]
        assert {"program_loc", "buffer_program_loc", "solve_rate", "unsolved_share"} <= set(metrics)
        assert result[arm]["steps"] == [3]
    assert 0 <= result["comparisons"]["probe_base"] <= 1
    assert (folder / "dynamics.png").stat().st_size > 10_000
    assert (folder / "population" / "seed-0" / "metrics.jsonl").is_file()
    assert "expected ~" in done.stderr  # a progress line per run with its expected minutes


def test_a_rerun_reuses_the_finished_runs(study):
    folder, first = study
    rerun = bench(folder, "--against", str(folder))  # against its own first summary: every difference 0
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert rerun.stderr.count("finished earlier (3 steps), reused") == 2
    assert "probe solve rate" not in rerun.stderr  # the probes' scores are kept with the runs
    result = json.loads(rerun.stdout.strip().splitlines()[-1])
    assert result["verdicts"] == json.loads(first.stdout.strip().splitlines()[-1])["verdicts"]
    against = result["against"]["population"]["valid_rate"]
    assert against["difference"] == 0 and against["verdict"] == "inconclusive" and not against["powered"]
    assert against["paired"]["seeds"] == [0] and against["paired"]["difference"] == 0  # seed 0 against itself
    assert f"population minus {folder}:" in rerun.stderr


def test_runs_of_another_study_are_refused_before_any_run(study):
    folder, _ = study
    before = sorted(p.name for p in (folder / "single").iterdir())
    other = bench(folder, overrides=[*OVERRIDES[:-1], "verifier.actors=1"])
    assert other.returncode != 0
    assert "holds runs of another study" in other.stderr and "overrides" in other.stderr
    assert "starting" not in other.stderr
    assert sorted(p.name for p in (folder / "single").iterdir()) == before
    missing = bench(folder, "--report-only", "--against", str(folder / "nowhere"))
    assert missing.returncode != 0 and "--against" in missing.stderr and "no summary.json there" in missing.stderr


def test_runs_of_older_code_are_refused_with_the_commit_to_finish_them_from(study, tmp_path):
    folder, _ = study
    assert "commit" in json.loads((folder / "study.json").read_text())  # recorded (None from a dirty tree)
    copy = tmp_path / "study"
    shutil.copytree(folder, copy)
    identity = json.loads((copy / "study.json").read_text())
    (copy / "study.json").write_text(json.dumps({**identity, "code_version": "0" * 16, "commit": "ab" * 20}))
    refused = bench(copy)
    assert refused.returncode != 0 and "code_version" in refused.stderr
    assert "from a checkout of commit abababababab (git worktree add ../study-abababab abababababab)" in refused.stderr
    assert "starting" not in refused.stderr


def test_a_failed_run_is_reported_and_left_out(study, tmp_path):
    folder, _ = study
    copy = tmp_path / "study"
    shutil.copytree(folder, copy)
    status = copy / "single" / "seed-0" / "status.json"
    status.write_text(json.dumps({**json.loads(status.read_text()), "state": "failed", "cause": "killed"}))
    done = bench(copy, "--report-only")
    assert done.returncode != 0
    assert "single seed 0 (1/1): failed at step 3; left out" in done.stderr
    assert "no finished run of single" in done.stderr


def test_an_interrupted_run_is_resumed_from_its_checkpoint(study, tmp_path):
    folder, first = study
    copy = tmp_path / "study"
    shutil.copytree(folder, copy)
    run = copy / "single" / "seed-0"
    shutil.rmtree(run / "checkpoints" / "step-3")  # killed after step 2's checkpoint (runs here save every step)
    (run / "checkpoints" / "latest").write_text("step-2")
    status = run / "status.json"
    status.write_text(json.dumps({**json.loads(status.read_text()), "state": "running", "last_step": 3}))
    done = bench(copy)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "single seed 0 (1/1): resuming from step 2, 1 steps" in done.stderr
    assert "population seed 0 (1/1): finished earlier (3 steps), reused" in done.stderr
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [r["step"] for r in rows if "valid_rate" in r] == [1, 2, 3]
    resumed, original = (json.loads(d.stdout.strip().splitlines()[-1])["single"]["metrics"]["program_loc"]
                         for d in (done, first))
    assert resumed == original  # a resumed run recomputes its steps exactly


def test_the_expected_minutes_come_from_the_steps_the_folder_kept(tmp_path):
    """A resumed or continued study announces its runs from its own recorded steps, not the idle-machine guess."""
    from studies.dynamics import SECONDS_PER_STEP, kept_pace, next_pace

    assert kept_pace(tmp_path, "population") is None  # nothing kept: the idle-machine guess
    assert next_pace(tmp_path, "population", {}) == SECONDS_PER_STEP["population"]
    for seed, seconds in ((0, (10.0, 14.0)), (1, (12.0,))):
        run = tmp_path / "population" / f"seed-{seed}"
        run.mkdir(parents=True)
        rows = [{"step": i + 1, "phase_seconds": {"propose": t - 4.0, "train": 4.0}} for i, t in enumerate(seconds)]
        rows.append({"event": "checkpoint", "checkpoint_step": 1, "seconds": 99.0})  # not a step
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert kept_pace(tmp_path, "population") == 12.0 != SECONDS_PER_STEP["population"]
    assert kept_pace(tmp_path, "single") is None
    # Recorded steps count (seed 1's one step as well, as a run still going would) until a run of this session
    # finishes; then that run's pace does.
    assert next_pace(tmp_path, "population", {}) == 12.0
    assert next_pace(tmp_path, "population", {"population": 30.0}) == 30.0
    assert next_pace(tmp_path, "single", {"population": 30.0}) == SECONDS_PER_STEP["single"]


def test_first_seed_selects_another_seed_set(study):
    """``--first-seed 1`` reads seed 1 only: the kept seed 0 is not counted, so nothing is there to report."""
    folder, _ = study
    other = bench(folder, "--report-only", "--first-seed", "1")
    assert other.returncode != 0 and "no finished run of population, single" in other.stderr
