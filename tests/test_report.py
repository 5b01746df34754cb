"""The report (reporting.report): its figures and summary.md, with every number in summary.md recomputed here
from the raw rows of metrics.jsonl (mean, closed-form slope, the slope's CI from numpy's covariance and an
integrated t quantile, the smoothed ends by explicit windows).

Two real short runs (population and single agent, tiny `test` model) and a 60-step pair written in the
exact schema of a real row (``reporting.step_metrics``), with a known rising and falling complexity and steps
without any valid task (whose 0.0 means must not count).
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from reporting.report import write_report
from reporting.run_dir import RunDirectory
from short_runs import ROOT
from student_t import t975_by_integration

FIGURES = ["compare.png", "complexity.png", "coverage.png", "lineage.png", "rates.png", "ratings.png"]
COUNTED_BY = {"program_ast_depth": "written_programs", "program_cyclomatic": "written_programs",
              "program_loc": "written_programs", "program_variables": "written_programs", "solve_rate": "rollouts",
              "student_reward": "rollouts"}
LABEL_KEYS = {"valid proposals (rate)": "valid_rate", "teacher reward": "teacher_reward", "solve rate": "solve_rate",
              "student reward": "student_reward", "AST depth": "program_ast_depth",
              "cyclomatic complexity": "program_cyclomatic", "lines of code": "program_loc",
              "variables": "program_variables", "AST n-grams seen (cumulative)": "coverage",
              "distinct program structures (cumulative)": "distinct_structures",
              "new program structures per step": "new_structures"}
CUMULATIVE = {"coverage", "distinct_structures"}


def read_rows(run_dir: Path) -> list[dict]:
    """The step rows (a run also logs events, e.g. each checkpoint's seconds)."""
    return RunDirectory(run_dir).read_metrics()


def expected(rows: list[dict], key: str) -> dict:
    """What summary.md must say of ``key``: computed from the raw rows, counting a step only where it measured the
    metric (a valid task for the complexity means, a rollout for the solve rate and student reward)."""
    points = [(r["step"], r[key]) for r in rows if "step" in r and r.get(COUNTED_BY.get(key, "step"), 1) >= 1]
    x = np.array([p[0] for p in points], dtype=float)
    y = np.array([p[1] for p in points], dtype=float)
    n = len(y)
    out: dict = {"n steps": n}
    if n == 0:
        return out
    h = max(1, min(5, n // 10))
    if key in CUMULATIVE:  # running totals are not smoothed
        out.update({"mean": y.sum() / n, "first (smoothed)": y[0], "last (smoothed)": y[-1]})
    else:
        out.update({"mean": y.sum() / n, "first (smoothed)": y[: h + 1].mean(), "last (smoothed)": y[-h - 1:].mean()})
    if n >= 3:
        out["OLS slope / step"] = (n * (x * y).sum() - x.sum() * y.sum()) / (n * (x * x).sum() - x.sum() ** 2)
        if key not in CUMULATIVE:
            _, cov = np.polyfit(x, y, 1, cov=True)
            ci = t975_by_integration(n - 2) * math.sqrt(cov[0, 0])
            out["95% CI +-"] = ci
            slope = out["OLS slope / step"]
            out["trend"] = "rises" if slope - ci > 0 else "falls" if slope + ci < 0 else "flat"
    return out


def tables(summary: str) -> dict[str, list[dict[str, str]]]:
    """Section heading (its figure's file name) -> the rows of its markdown table, as column -> cell."""
    out: dict[str, list[dict[str, str]]] = {}
    section = None
    header: list[str] = []
    for line in summary.splitlines():
        if line.startswith("## "):
            section = line[3:].split(":")[0]
            out[section] = []
            header = []
        elif line.startswith("|") and section:
            cells = [c.strip() for c in line.strip("|").split("|")]
            if not header:
                header = cells
            elif not set(line) <= set("|-"):
                out[section].append(dict(zip(header, cells)))
    return out


def check_row(cells: dict[str, str], want: dict) -> None:
    assert int(cells["n steps"]) == want["n steps"], cells
    for column in ("mean", "first (smoothed)", "last (smoothed)", "OLS slope / step", "95% CI +-"):
        if column in want:
            assert float(cells[column]) == pytest.approx(want[column], rel=1e-3, abs=1e-6), (column, cells)
        else:
            assert cells[column] == "-", (column, cells)
    assert cells["trend"] == want.get("trend", "-"), cells


def check_summary(plots: Path, runs: list[tuple[str, list[dict]]]) -> dict[str, list[dict[str, str]]]:
    """Every trend row of summary.md against the raw rows; returns the parsed tables."""
    parsed = tables((plots / "summary.md").read_text())
    rows = runs[0][1]
    rates = parsed["rates.png"]
    assert [(r["role"], LABEL_KEYS[r["metric"]]) for r in rates] == [
        ("teachers", "valid_rate"), ("teachers", "teacher_reward"),
        ("students", "solve_rate"), ("students", "student_reward")]
    for section in ("rates.png", "complexity.png", "coverage.png"):
        for cells in parsed[section]:
            check_row(cells, expected(rows, LABEL_KEYS[cells["metric"]]))
    assert [LABEL_KEYS[r["metric"]] for r in parsed["complexity.png"]] == list(COUNTED_BY)[:4]
    members = {m["id"]: m for row in rows for m in row["members"]}  # the last record of each member
    assert {r["member"]: float(r["mu at last"]) for r in parsed["ratings.png"]} == pytest.approx(
        {k: m["mu"] for k, m in members.items()}, rel=1e-3)
    if len(runs) > 1:
        compared = parsed["compare.png"]
        assert {r["run"] for r in compared} == {name for name, _ in runs}
        by_run = dict(runs)
        for cells in compared:
            check_row(cells, expected(by_run[cells["run"]], LABEL_KEYS[cells["metric"]]))
    return parsed


def check_figures(written: list[Path], plots: Path, compared: bool) -> None:
    names = FIGURES if compared else [f for f in FIGURES if f != "compare.png"]
    assert sorted(p.name for p in written) == sorted(names + ["summary.md"])
    for name in names:
        data = (plots / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, name


# ---------------------------------------------------------------- 60 steps in a real row's schema

def schema_row(step: int, members: list[dict], valid_tasks: int, depth: float, rng: np.random.Generator) -> dict:
    """One row with every key ``reporting.step_metrics.step_row`` writes (after the driver moved ``examples``)."""
    complexity = {"program_ast_depth": depth, "program_cyclomatic": 1 + depth / 4, "program_loc": depth - 1,
                  "program_variables": 2 + rng.normal(scale=0.3)}
    if valid_tasks == 0:
        complexity = dict.fromkeys(complexity, 0.0)  # step_metrics' mean of nothing
    rollouts = valid_tasks * 4
    return {
        "step": step, "members": members,
        "valid_rate": round(valid_tasks / 12, 4),
        "solve_rate": round(float(rng.uniform(0.1, 0.5)), 4) if rollouts else 0.0,
        "teacher_reward": round(float(rng.uniform(-0.5, 0.5)), 4),
        "student_reward": round(float(rng.uniform(-0.5, 0.2)), 4) if rollouts else 0.0,
        **{k: round(float(v), 4) for k, v in complexity.items()},
        "coverage": 100 + 7 * step, "distinct_structures": 3 * step, "new_structures": int(rng.integers(0, 6)),
        "written_programs": valid_tasks,
        **{f"buffer_program_{k}": 2.0 for k in ("ast_depth", "cyclomatic", "loc", "variables")},
        "buffer_programs": 8, "buffer_seed_share": round(max(0.0, 1 - step / 30), 4),
        "valid_tasks": valid_tasks, "rollouts": rollouts, "rho_histogram": [1, 2, 3, 2, 1, 0],
        "rho_by_teacher": {m["id"]: [1, 0, 0, 0, 0, 0] for m in members if m["role"] != "student"},
        "matches": [[m["id"], m["id"]] for m in members[:1]],
        "per_family": {f: {"proposals": 4, "valid_rate": 0.5, "mean_rho": 0.3} for f in ("code_o", "code_i", "code_f")},
        "phase_seconds": {"match": 0.01, "propose": 1.0, "validate": 0.2, "solve": 1.5, "update": 3.0},
        "evolution": [], "train": {m["id"]: {"loss": 0.1, "tokens": 400.0, "samples": 6.0} for m in members},
        "prompt_style": "compact", "prompt_budget": 832, "prompt_tokens_max": 276, "references_dropped": 0,
        "dropped_requests": {"teacher": 0, "student": 0}, "dropped_reasons": {},
    }


def member(member_id: str, role: str, mu: float, parent: list[str] | None = None) -> dict:
    return {"id": member_id, "role": role, "mu": round(mu, 4), "sigma": 2.0, "conservative": round(mu - 6, 4),
            "parent": parent, "reward": 0.1}


def write_run(run_dir: Path, single: bool, seed: int) -> list[dict]:
    """60 steps: AST depth rising 0.05/step (population) or falling 0.05/step (single agent), noise sd 0.3;
    every 7th step without a valid task; the population evolves a teacher and a student every 10 steps."""
    rng = np.random.default_rng(seed)
    run_dir.mkdir()
    rows = []
    teachers, students = ["t0", "t1"], ["s0", "s1"]
    for step in range(1, 61):
        depth = 5 + (-0.05 if single else 0.05) * step + rng.normal(scale=0.3)
        if single:
            members = [member("a0", "agent", 25.0)]
            events = []
        else:
            events = []
            if step % 10 == 0:
                for pool, role in ((teachers, "teacher"), (students, "student")):
                    child = f"{role[0]}{step // 10 + 1}"
                    events.append({"id": child, "role": role, "parents": [pool[-1]], "operator": "rotate_subspace",
                                   "step": step, "child": child, "replaced": pool[0], "victim": pool[0]})
                    pool[:] = [pool[-1], child]
            members = [member(t, "teacher", 25 + 0.05 * step + i, [teachers[0]] if i and step >= 10 else None)
                       for i, t in enumerate(teachers)]
            members += [member(s, "student", 25 - 0.05 * step - i) for i, s in enumerate(students)]
        row = schema_row(step, members, 0 if step % 7 == 0 else 6 + step % 5, depth, rng)
        row["evolution"] = events
        rows.append(row)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def test_sixty_step_runs_summary_matches_metrics_and_finds_the_trends(tmp_path):
    pop = write_run(tmp_path / "pop", single=False, seed=0)
    single = write_run(tmp_path / "single", single=True, seed=1)
    written = write_report([tmp_path / "pop", tmp_path / "single"])
    plots = tmp_path / "pop" / "plots"
    check_figures(written, plots, compared=True)
    parsed = check_summary(plots, [("pop", pop), ("single", single)])
    depth = {r["run"]: r for r in parsed["compare.png"] if r["metric"] == "AST depth"}
    assert depth["pop"]["trend"] == "rises" and depth["single"]["trend"] == "falls"
    assert int(depth["pop"]["n steps"]) == 60 - 8  # steps 7, 14, ..., 56 had no valid task
    assert "12 evolution events: rotate_subspace 12" in (plots / "summary.md").read_text()
    assert "(population 2T+2S) vs single (single agent)" in (plots / "summary.md").read_text()


def test_report_of_a_single_run_has_no_comparison_and_the_cli_prints_the_summary(tmp_path):
    rows = write_run(tmp_path / "single", single=True, seed=2)
    out = subprocess.run([sys.executable, "-m", "reporting", str(tmp_path / "single")], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    plots = tmp_path / "single" / "plots"
    check_figures([Path(p) for p in out.stdout.split()], plots, compared=False)
    parsed = check_summary(plots, [("single", rows)])
    assert "compare.png" not in parsed
    assert "The single agent proposes" in (plots / "summary.md").read_text()


def test_report_states_how_each_run_stopped(tmp_path):
    from reporting.run_dir import RunDirectory

    write_run(tmp_path / "pop", single=False, seed=3)
    write_run(tmp_path / "single", single=True, seed=4)
    RunDirectory(tmp_path / "pop").write_status("failed", 41, 1, "RuntimeError: CPU Generator does not use offset")
    out = subprocess.run([sys.executable, "-m", "reporting", str(tmp_path / "pop"), str(tmp_path / "single")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    failed = "it failed at step 41, after recovering 1 time(s): RuntimeError: CPU Generator does not use offset"
    unknown = "it recorded no status (written by an older version)"
    assert f"pop: {failed}" in out.stderr and f"single: {unknown}" in out.stderr
    summary = (tmp_path / "pop" / "plots" / "summary.md").read_text()
    assert f"Status of pop: {failed}." in summary and f"Status of single: {unknown}." in summary
    assert all(Path(p).is_file() for p in out.stdout.split())  # stdout still lists only the written files


# ---------------------------------------------------------------- real short runs

@pytest.fixture(scope="module")
def real_runs(short_run_resumed, single_agent_run, tmp_path_factory) -> tuple[Path, Path]:
    """Copies of two shared runs on the tiny test model (conftest): the 3-step population run (resumed once) and
    the 3-step single-agent run."""
    root = tmp_path_factory.mktemp("report_runs")
    for name, run in (("population", short_run_resumed), ("single", single_agent_run)):
        assert run.returncode == 0, run.stderr[-3000:]
        shutil.copytree(run.run_dir, root / name)
    return root / "population", root / "single"


@pytest.mark.slow
def test_report_on_real_population_and_single_agent_runs(real_runs):
    pop, single = real_runs
    out = subprocess.run([sys.executable, "-m", "reporting", str(pop), str(single)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    plots = pop / "plots"
    check_figures([Path(p) for p in out.stdout.split()], plots, compared=True)
    pop_rows, single_rows = read_rows(pop), read_rows(single)
    assert [r["step"] for r in pop_rows] == [1, 2, 3] and {m["role"] for m in single_rows[0]["members"]} == {"agent"}
    parsed = check_summary(plots, [("population", pop_rows), ("single", single_rows)])
    assert len(parsed["compare.png"]) == 16  # eight metrics, two runs
    assert len(parsed["ratings.png"]) == len({m["id"] for r in pop_rows for m in r["members"]})


def test_report_skips_event_records_stops_at_a_cut_line_and_refuses_an_empty_log(tmp_path):
    rows = write_run(tmp_path / "pop", single=False, seed=3)[:20]
    lines = [json.dumps(r) for r in rows]
    lines.insert(10, json.dumps({"event": "recovery", "recovery": 1, "actors": ["learner-0"], "failed_step": 11}))
    (tmp_path / "pop" / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 21, "valid_ra')
    write_report([tmp_path / "pop"])
    check_summary(tmp_path / "pop" / "plots", [("pop", rows)])
    assert "20 steps (1-20)" in (tmp_path / "pop" / "plots" / "summary.md").read_text()
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "metrics.jsonl").write_text("")
    out = subprocess.run([sys.executable, "-m", "reporting", str(tmp_path / "empty")], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "holds no steps yet" in out.stderr


def test_the_old_entry_point_still_works_and_says_where_it_moved(tmp_path):
    """``python -m actors.report`` (before the reports moved to ``reporting/``) keeps working for one release."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "metrics.jsonl").write_text("")
    out = subprocess.run([sys.executable, "-m", "actors.report", str(tmp_path / "empty")], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "holds no steps yet" in out.stderr
    assert "moved to `python -m reporting`" in out.stderr
