"""Benchmark scores over training in the report (``reporting.report_eval``): ``eval.png`` and the numbers of
summary.md with the step each is from, recomputed here from the rows of metrics.jsonl.

The runs are written in the schema of real rows (``test_report.schema_row``, members with id/role/parent,
evolution events as the league writes them) with ``eval/<benchmark>/<member>``, ``.../base`` and
``.../population_mean`` every 3 steps, as ``evaluation.training`` adds them: a population whose teacher t0
is replaced at step 6 by a child of t1, beside a single-agent run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from reporting.report import write_report
from short_runs import ROOT
from test_report import member, schema_row, tables

EVERY = 3
STEPS = 12
BENCHMARKS = ("humaneval+", "gsm8k")


def score(member_id: str, benchmark: str, step: int) -> float:
    """A known score per member, benchmark and step (exact in binary: multiples of 1/16)."""
    base = {"t0": 2, "t1": 5, "teacher-1": 7, "s0": 4, "s1": 3, "a0": 4}[member_id]
    shift = 1 if benchmark == "gsm8k" else 0
    return (base + shift + step // EVERY) / 16


def write_run(run_dir: Path, single: bool, seed: int) -> list[dict]:
    """STEPS rows; every EVERY steps the eval entries of the members alive after that step's evolution."""
    rng = np.random.default_rng(seed)
    run_dir.mkdir()
    rows = []
    teachers = ["a0"] if single else ["t0", "t1"]
    students = [] if single else ["s0", "s1"]
    for step in range(1, STEPS + 1):
        events = []
        if not single and step == 6:  # t1's child replaces t0 (the league's event record)
            events.append({"id": "teacher-1", "role": "teacher", "parents": ["t1"], "operator": "svd_perturb",
                           "strength": 0.1, "step": 6, "victim": "t0", "mu": 25.0, "sigma": 4.0,
                           "child": "teacher-1", "replaced": "t0"})
            teachers = ["t1", "teacher-1"]
        members = [member(t, "agent" if single else "teacher", 25.0, ["t1"] if t == "teacher-1" else None)
                   for t in teachers]
        members += [member(s, "student", 25.0) for s in students]
        row = schema_row(step, members, 6, 5.0, rng)
        row["evolution"] = events
        if step % EVERY == 0:
            ids = [m["id"] for m in members]
            for b in BENCHMARKS:
                row.update({f"eval/{b}/{m}": score(m, b, step) for m in ids})
                row[f"eval/{b}/base"] = 1 / 16
                row[f"eval/{b}/population_mean"] = sum(score(m, b, step) for m in ids) / len(ids)
        rows.append(row)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def alive(rows: list[dict], step: int) -> list[str]:
    """The members evaluated at ``step`` (after its evolution)."""
    row = next(r for r in rows if r["step"] == step)
    return sorted({k.split("/")[2] for k in row if k.startswith("eval/")} - {"base", "population_mean"})


def weakest(rows: list[dict], step: int) -> str:
    """The member with the lowest mean over the benchmarks at ``step`` (results.md's rule)."""
    return min(alive(rows, step), key=lambda m: (sum(score(m, b, step) for b in BENCHMARKS), m))


def pct(value: float) -> str:
    return f"{100 * value:.1f}"


def test_report_plots_scores_over_training_beside_the_single_agent(tmp_path):
    pop = write_run(tmp_path / "pop", single=False, seed=0)
    write_run(tmp_path / "single", single=True, seed=1)
    written = write_report([tmp_path / "pop", tmp_path / "single"])
    plots = tmp_path / "pop" / "plots"
    assert plots / "eval.png" in written
    data = (plots / "eval.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000

    rows = {(r["benchmark"], r["model"]): r for r in tables((plots / "summary.md").read_text())["eval.png"]}
    evaluated = list(range(EVERY, STEPS + 1, EVERY))
    for b in BENCHMARKS:
        # the population mean and the weakest member at each evaluated step, from the raw rows
        means = {s: np.mean([score(m, b, s) for m in alive(pop, s)]) for s in evaluated}
        mean = rows[(b, "population mean")]
        assert (mean["last"], mean["last at step"]) == (pct(means[STEPS]), str(STEPS))
        best = max(evaluated, key=lambda s: (means[s], -s))
        assert (mean["best"], mean["best at step"], mean["evaluated steps"]) == (pct(means[best]), str(best), "3-12 (4)")
        weak = rows[(b, "weakest member")]
        assert weak["last"] == pct(score(weakest(pop, STEPS), b, STEPS))
        assert weak["note"] == f"{weakest(pop, STEPS)} at step {STEPS}"
        assert [weakest(pop, s) for s in evaluated] == ["t0", "s1", "s1", "s1"]  # t0 was the weakest until replaced
        assert (rows[(b, "base")]["last"], rows[(b, "base")]["last at step"]) == ("6.2", str(STEPS))
        # the replaced member's line ends at its last evaluation; the child's starts after its birth
        t0, child = rows[(b, "t0")], rows[(b, "teacher-1")]
        assert (t0["last"], t0["last at step"], t0["evaluated steps"]) == (pct(score("t0", b, 3)), "3", "3")
        assert t0["note"] == "replaced at step 6"
        assert (child["last"], child["last at step"], child["evaluated steps"]) == (pct(score("teacher-1", b, 12)), "12", "6-12 (3)")
        assert child["note"] == "child of t1 (svd_perturb) at step 6; live at the end"
        assert rows[(b, "s0")]["note"] == "live at the end"
        # the single agent beside it
        agent = rows[(b, "single (single agent): mean")]
        assert (agent["last"], agent["last at step"], agent["best"]) == (pct(score("a0", b, 12)), "12", pct(score("a0", b, 12)))
    assert {model for _, model in rows} == {"population mean", "weakest member", "base", "t0", "t1", "teacher-1", "s0",
                                            "s1", "single (single agent): mean"}


def test_lineage_and_series_behind_the_figure(tmp_path):
    from reporting.report_eval import eval_series, lineage

    pop = write_run(tmp_path / "pop", single=False, seed=2)
    series = eval_series(pop)
    assert list(series) == list(BENCHMARKS)
    gsm8k = series["gsm8k"]
    assert gsm8k.steps == [3, 6, 9, 12]
    assert [s for s, _ in gsm8k.members["t0"]] == [3] and [s for s, _ in gsm8k.members["teacher-1"]] == [6, 9, 12]
    assert [name for _, _, name in gsm8k.weakest] == ["t0", "s1", "s1", "s1"]
    tree = lineage(pop)
    assert tree.parent == {"teacher-1": "t1"} and tree.replaced == {"t0": 6} and tree.born == {"teacher-1": 6}
    # a row without population_mean (an older log): the mean over the members
    for row in pop:
        row.pop("eval/gsm8k/population_mean", None)
    recomputed = eval_series(pop)["gsm8k"].mean
    assert [s for s, _ in recomputed] == gsm8k.steps and [v for _, v in recomputed] == pytest.approx([v for _, v in gsm8k.mean])


def test_no_eval_entries_no_eval_figure_and_the_cli_lists_it(tmp_path):
    rows = write_run(tmp_path / "plain", single=False, seed=3)
    stripped = [{k: v for k, v in r.items() if not k.startswith("eval/")} for r in rows]
    (tmp_path / "plain" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in stripped))
    written = write_report([tmp_path / "plain"])
    assert "eval.png" not in {p.name for p in written}
    assert "eval.png" not in (tmp_path / "plain/plots/summary.md").read_text()
    write_run(tmp_path / "pop", single=False, seed=4)
    out = subprocess.run([sys.executable, "-m", "reporting", str(tmp_path / "pop")], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert str(tmp_path / "pop/plots/eval.png") in out.stdout.split()
