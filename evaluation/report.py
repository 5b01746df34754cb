"""The outputs of an evaluation: ``results.json``, a markdown table shaped like the paper's, a PNG chart.

Table rows: every population member, the population mean (mean over members of each column), the
weakest member (the member with the lowest mean over the benchmarks), the base, and the compared
run (its members and their mean). Columns: each benchmark's pass@k (k = 1 unless asked) and the
mean over benchmarks. Scores are percentages.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _row_scores(model: dict[str, Any], benchmarks: list[str], key: str) -> list[float | None]:
    return [model["benchmarks"].get(b, {}).get(key) for b in benchmarks]


def _mean(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def table_rows(results: dict[str, Any], key: str = "pass@1") -> tuple[list[str], list[tuple[str, list[float | None]]]]:
    """(benchmarks, [(row label, scores per benchmark + mean)]) in the paper's order."""
    benchmarks = list(results["benchmarks"])
    models = results["models"]
    rows: list[tuple[str, list[float | None]]] = []

    def with_mean(scores: list[float | None]) -> list[float | None]:
        return scores + [_mean(scores)]

    def group_rows(group: str, title: str) -> None:
        members = [(label, with_mean(_row_scores(m, benchmarks, key))) for label, m in models.items() if m["group"] == group]
        rows.extend(members)
        if len(members) > 1:
            columns = list(zip(*(s for _, s in members)))
            rows.append((f"{title} mean", [_mean(list(c)) for c in columns]))
            if group == "population":
                weakest = min(members, key=lambda r: (r[1][-1] is None, r[1][-1] or 0.0))
                rows.append((f"weakest member ({weakest[0]})", weakest[1]))

    group_rows("population", "population")
    for label, m in models.items():
        if m["group"] in ("base", "oracle"):
            rows.append((label, with_mean(_row_scores(m, benchmarks, key))))
    group_rows("compare", "compared run")
    return benchmarks, rows


def _table(results: dict[str, Any], key: str, only: list[str] | None = None) -> list[str]:
    benchmarks, rows = table_rows(results, key)
    if only is not None:
        keep = [i for i, b in enumerate(benchmarks) if b in only]
        benchmarks = [benchmarks[i] for i in keep]
        rows = [(label, [scores[i] for i in keep] + [_mean([scores[i] for i in keep])]) for label, scores in rows]
    head = f"| model | {' | '.join(benchmarks)} | mean |"
    rule = "|---|" + "---:|" * (len(benchmarks) + 1)
    return [head, rule, *(f"| {label} | {' | '.join(_fmt(v) for v in scores)} |" for label, scores in rows)]


def markdown_table(results: dict[str, Any], key: str = "pass@1") -> str:
    """The paper-shaped table; for HumanEval+ / MBPP+ the headline is the plus score (base and plus
    inputs) and a second table gives the base-only score, as evalplus reports both."""
    lines = _table(results, key)
    with_base = [b for b in results["benchmarks"]
                 if any(f"base_{key}" in m["benchmarks"].get(b, {}) for m in results["models"].values())]
    if with_base:
        lines += ["", f"Base tests only (evalplus's base {key}; the table above is base + plus):", "",
                  *_table(results, f"base_{key}", with_base)]
    compared = (f" (the compared run's from {results['compare_run_dir']} {results['compare_checkpoint']})"
                if results.get("compare_checkpoint") else "")
    lines.append(f"\n{key} in %, every number from {results.get('checkpoint', '')}{compared}; grader: {results.get('math_grader', '-')}; "
                 f"{results.get('judged_as', '')}.")
    errors = {n: s["data_errors"] for m in results["models"].values() for n, s in m["benchmarks"].items() if s.get("data_errors")}
    for name, tasks in errors.items():
        lines.append(f"Data errors in {name} ({len(tasks)} task(s) whose reference fails, counted as failed): {', '.join(tasks)}.")
    if results.get("complete") is False:
        lines.append("INCOMPLETE: not evaluated: " + "; ".join(f"{n}: {e}" for n, e in results.get("errors", {}).items()))
    return "\n".join(lines) + "\n"


def chart(results: dict[str, Any], path: Path, key: str = "pass@1") -> None:
    """Grouped bars per benchmark: population mean, weakest member, base, compared run mean."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    benchmarks, rows = table_rows(results, key)
    wanted = [r for r in rows if r[0].startswith(("population mean", "weakest member", "base", "compared run mean", "oracle"))]
    if not wanted:
        wanted = rows
    fig, ax = plt.subplots(figsize=(max(5, 1.6 * len(benchmarks) + 2), 3.5))
    width = 0.8 / max(1, len(wanted))
    for j, (label, scores) in enumerate(wanted):
        xs = [i + j * width for i in range(len(benchmarks))]
        ax.bar(xs, [100 * (s or 0.0) for s in scores[: len(benchmarks)]], width, label=label)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(benchmarks))], benchmarks)
    ax.set_ylabel(f"{key} (%)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_outputs(results: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    """Write results.json, results.md and results.png into ``out_dir`` (created)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "results.json", "table": out_dir / "results.md", "chart": out_dir / "results.png"}
    paths["json"].write_text(json.dumps(results, indent=1))
    paths["table"].write_text(markdown_table(results))
    chart(results, paths["chart"])
    return paths
