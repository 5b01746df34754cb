"""One command for a GPU machine with torch, transformers and peft but no Ray, no vLLM and no network.

    python bench/gpu_check.py                      # everything, JSON to gpu_check.json and as the last stdout line
    python bench/gpu_check.py --dry                # list the parts and their commands, run nothing

Parts, each in its own subprocess (a failure or timeout is recorded in the JSON, never a crash):

1. ``gpu_tests``: the tests marked ``gpu`` in files that import without Ray (``ray`` is blocked in the
   pytest process, so a file that needs it fails to collect and is reported under ``needs_ray``);
2. ``memory_plan``: ``bench/memory_plan.py --device cuda --layers 28``, the full 7B-shaped learner on one GPU
   measured against ``planning.memory_plan`` (``torch.cuda.max_memory_allocated``);
3. ``learner``: ``bench/learner.py --device cuda --widths 7b --layers 28``: one optimizer step of 8 mixed
   adapters vs the same tokens on 1 (and the bmm kernel), the whole 7B-shaped model, the 7B preset's LoRA and
   step settings (``mixed8_vs_single_ratio``, wall seconds, ``max_memory_allocated`` per variant);
4. ``evolution``: ``bench/evolution.py --device cuda``.

A bench part runs only where the script's ``--help`` lists the options it is given (``--device``,
``--widths``); otherwise it is recorded as not run, with the reason.

Each part is judged against its goal, not only its exit code (``goal`` and ``passed`` in its entry):
``gpu_tests`` every GPU test that imports without Ray passes (at least one ran); ``memory_plan`` the plan within
15% of every measured peak and never under one, and only configurations the plan says do not fit run out of memory
(the bench's ``within_goal``); ``learner`` 8 mixed adapters cost at most 1.15x one adapter with the same tokens;
``evolution`` every operator makes a 7B rank-64 child within its time goal. ``ok`` is the conjunction.

Besides torch, transformers and peft the project's modules need pydantic, trueskill, pyyaml, safetensors and
pytest (``REQUIRED``); a missing one stops the check at once with one line naming them and how to install them.
Without a CUDA device every part but the listing is recorded as skipped (``"status": "skipped"``) and ``ok`` is
false.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BLOCK_RAY = "import sys; sys.modules['ray'] = None; import pytest; sys.exit(pytest.main(sys.argv[1:]))"
REQUIRED = {"torch": "torch", "transformers": "transformers", "peft": "peft", "pydantic": "pydantic",
            "trueskill": "trueskill", "yaml": "pyyaml", "safetensors": "safetensors", "pytest": "pytest"}
"""Import name -> PyPI name of what the parts import (no Ray, no vLLM)."""
LEARNER_RATIO_GOAL = 1.15


def missing_requirements() -> list[str]:
    """PyPI names of the ``REQUIRED`` modules that do not import here."""
    import importlib.util

    return [pypi for module, pypi in REQUIRED.items() if importlib.util.find_spec(module) is None]


def judge(name: str, part: dict) -> dict:
    """``goal`` (in words) and ``passed`` of one finished part, from its status and its bench's JSON."""
    result = part.get("result") or {}
    if name == "gpu_tests":
        ran = part.get("tests", 0) - part.get("skipped", 0)
        return {"goal": "every gpu-marked test that imports without Ray passes",
                "passed": part["status"] == "ok" and not part.get("failed") and ran > 0}
    if name == "memory_plan":
        return {"goal": "plan within 15% of every measured peak, never under one; only planned OOMs",
                "passed": part["status"] == "ok" and result.get("within_goal") is True}
    if name == "learner":
        ratio = result.get("mixed8_vs_single_ratio")
        return {"goal": f"mixed 8 adapters / 1 adapter <= {LEARNER_RATIO_GOAL}",
                "passed": part["status"] == "ok" and ratio is not None and ratio <= LEARNER_RATIO_GOAL}
    if name == "evolution":
        within = result.get("within_goal") or {}
        return {"goal": f"every operator's 7B rank-64 child within {result.get('goal_s', '?')} s",
                "passed": part["status"] == "ok" and bool(within) and all(within.values())}
    return {"goal": "exit status 0", "passed": part["status"] == "ok"}


def gpu_test_files() -> list[str]:
    """Test files that hold at least one ``@pytest.mark.gpu`` test."""
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py") if "pytest.mark.gpu" in p.read_text())


def last_json_line(text: str) -> dict | None:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                return None
    return None


def run(cmd: list[str], timeout: float) -> dict:
    """Run ``cmd`` in the repository root; return code, seconds, the tails of its output, or the timeout."""
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return {"status": "timeout", "seconds": round(time.perf_counter() - start, 1), "stdout_tail": out[-2000:]}
    return {
        "status": "ok" if proc.returncode == 0 else "failed",
        "returncode": proc.returncode,
        "seconds": round(time.perf_counter() - start, 1),
        "stdout": proc.stdout,
        "stderr_tail": proc.stderr[-3000:],
    }


def junit_summary(path: Path) -> dict:
    """Counts and the failing test ids of a pytest JUnit XML report."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    out = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0, "failed": [], "needs_ray": []}
    for suite in suites:
        for key in ("tests", "failures", "errors", "skipped"):
            out[key] += int(suite.get(key, 0))
        for case in suite.iter("testcase"):
            bad = case.find("failure") if case.find("failure") is not None else case.find("error")
            if bad is None:
                continue
            name = f"{case.get('classname')}::{case.get('name')}"
            message = (bad.get("message") or "") + (bad.text or "")
            (out["needs_ray"] if re.search(r"\bray\b", message) and "import" in message.lower() else out["failed"]).append(name)
    return out


def part_gpu_tests(timeout: float, report_dir: Path) -> dict:
    files = gpu_test_files()
    xml = report_dir / "gpu_tests.xml"
    result = run([sys.executable, "-c", BLOCK_RAY, "-m", "gpu", "-q", "-p", "no:cacheprovider",
                  "--continue-on-collection-errors", f"--junitxml={xml}", *files], timeout)
    result["files"] = files
    tail = result.pop("stdout", "")
    result["stdout_tail"] = tail[-2000:]
    if xml.is_file():
        result.update(junit_summary(xml))
        # collection errors of files that need Ray are expected here; anything else fails the part
        if result["status"] == "failed" and not result["failed"] and result["needs_ray"]:
            result["status"] = "ok"
    return result


def part_bench(cmd: list[str], timeout: float) -> dict:
    result = run(cmd, timeout)
    stdout = result.pop("stdout", "")
    result["command"] = " ".join(cmd[1:])
    result["result"] = last_json_line(stdout)
    if result["status"] == "ok" and result["result"] is None:
        result["status"] = "failed"
        result["reason"] = "no JSON object on the last stdout line"
    return result


def offers(script: str, *options: str) -> tuple[bool, str]:
    """Whether ``python bench/<script> --help`` lists every one of ``options``; and if not, why."""
    try:
        proc = subprocess.run([sys.executable, f"bench/{script}", "--help"], cwd=ROOT, capture_output=True, text=True,
                              timeout=300)
    except subprocess.TimeoutExpired:
        return False, f"bench/{script} --help timed out"
    if proc.returncode != 0:
        return False, f"bench/{script} --help failed ({proc.returncode}): {proc.stderr.strip()[-300:]}"
    missing = [o for o in options if not re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", proc.stdout)]
    if missing:
        return False, f"bench/{script} has no {'/'.join(missing)} option yet (its --help does not list it)"
    return True, ""


def parts(args: argparse.Namespace) -> dict[str, dict]:
    """Each part's command, or why it cannot run here."""
    py = sys.executable
    out: dict[str, dict] = {
        "gpu_tests": {"command": f"pytest -m gpu (ray blocked) {' '.join(gpu_test_files())}"},
        "memory_plan": {"command": [py, "bench/memory_plan.py", "--device", "cuda", "--layers", str(args.layers)]},
    }
    benches = {
        "learner": ("learner.py", ["--device", "cuda", "--widths", "7b", "--layers", str(args.layers)]),
        "evolution": ("evolution.py", ["--device", "cuda"]),
    }
    for name, (script, options) in benches.items():
        ok, reason = offers(script, *(o for o in options if o.startswith("--")))
        out[name] = {"command": [py, f"bench/{script}", *options]} if ok else {"skip": reason}
    return out


def cuda_info() -> dict:
    try:
        import torch
    except ImportError as exc:
        return {"available": False, "reason": f"torch: {exc}"}
    if not torch.cuda.is_available():
        return {"available": False, "torch": torch.__version__, "reason": "torch.cuda.is_available() is False"}
    props = torch.cuda.get_device_properties(0)
    return {"available": True, "torch": torch.__version__, "device": props.name, "memory_gib": round(props.total_memory / 2**30, 2),
            "count": torch.cuda.device_count()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "gpu_check.json")
    parser.add_argument("--layers", type=int, default=28, help="decoder layers of the 7B-shaped model (memory-plan and learner benches)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds allowed to each part")
    parser.add_argument("--dry", action="store_true", help="list the parts and their commands, run nothing")
    args = parser.parse_args(argv)
    missing = missing_requirements()
    if missing:
        print(f"gpu_check: this machine lacks {', '.join(missing)}; install them first "
              f"(pip install {' '.join(missing)}, or carry their wheels) and run the check again", file=sys.stderr)
        print(json.dumps({"ok": False, "missing": missing}))
        return 2
    plan = parts(args)
    cuda = cuda_info()
    report: dict = {"cuda": cuda, "parts": {}}
    for name, part in plan.items():
        command = part.get("command")
        shown = " ".join(command[1:]) if isinstance(command, list) else command
        if args.dry:
            report["parts"][name] = {"status": "listed", "command": shown, **({"skip": part["skip"]} if "skip" in part else {})}
        elif "skip" in part:
            report["parts"][name] = {"status": "not_run", "reason": part["skip"]}
        elif not cuda["available"]:
            report["parts"][name] = {"status": "skipped", "reason": f"no CUDA device ({cuda.get('reason')})", "command": shown}
        else:
            print(f"[gpu_check] {name}: {shown}", file=sys.stderr, flush=True)
            try:
                report["parts"][name] = (part_gpu_tests(args.timeout, args.out.parent) if name == "gpu_tests"
                                         else part_bench(command, args.timeout))
            except Exception as exc:  # a broken part is recorded, the others still run
                report["parts"][name] = {"status": "failed", "reason": f"{type(exc).__name__}: {exc}"}
            report["parts"][name].update(judge(name, report["parts"][name]))
            print(f"[gpu_check] {name}: {'PASS' if report['parts'][name]['passed'] else 'FAIL'} "
                  f"({report['parts'][name]['goal']})", file=sys.stderr, flush=True)
    report["ok"] = bool(report["parts"]) and all(p.get("passed", p["status"] == "listed") for p in report["parts"].values())
    if not args.dry:
        args.out.write_text(json.dumps(report, indent=1))
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
