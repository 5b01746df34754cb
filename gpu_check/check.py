"""One command for a GPU machine with torch, transformers and peft but no Ray, no vLLM and no network.

    python -m gpu_check                      # everything, JSON to gpu_check.json and as the last stdout line
    python -m gpu_check --dry                # list the parts and their commands, run nothing

Parts, each in its own subprocess (a failure or timeout is recorded in the JSON, never a crash; the JSON is
rewritten after every part with ``"unfinished": true`` until the last, so a check cut short keeps what finished,
and a part that does not pass prints why: its timeout, exit code, failing tests or the numbers against its goal):

1. ``gpu_tests``: the tests marked ``gpu`` in files that import without Ray (``ray`` is blocked in the
   pytest process, so a file that needs it fails to collect and is reported under ``needs_ray``);
2. ``memory_plan``: ``python -m bench.memory_plan --device cuda --layers 28``, the full 7B-shaped learner on one GPU
   measured against ``planning.memory_plan`` (``torch.cuda.max_memory_allocated``);
3. ``learner``: ``python -m bench.learner --device cuda --widths 7b --layers 28``: one optimizer step of 8 mixed
   adapters vs the same tokens on 1 (and the bmm kernel), the whole 7B-shaped model, the 7B preset's LoRA and
   step settings (``mixed8_vs_single_ratio``, wall seconds, ``max_memory_allocated`` per variant);
4. ``evolution``: ``python -m bench.operators --device cuda``;
5. ``system``: ``gpu_check/system.py``, the whole loop through Ray on the GPU: the tiny default in the
   one-GPU colocated layout (``resources.colocated=true resources.inference_gpus=1 resources.learner_gpus=1``, the
   transformers engine, which stays awake), ``run.checkpoint_every=2``, on the tiny ``test`` model (built where not
   cached, ``model.build_s``; ``--variant default`` for the tiny default's own, ``--model-dir`` for one carried in).
   (a) a 6-step reference run in which every actor is asked through Ray where its tensors are (read inside the
   actor: ``tensor_devices``), the second learner's device memory after construction, beyond its own LoRA slots,
   is under a tenth of the base's bytes (it maps the first learner's copy by CUDA IPC), and the engine's adapter
   versions change after every step; (b) the student learner SIGKILLed after step 3: the run recovers by itself
   and ends with the reference's adapters (safetensors bytes), league state and rows; (c) a run stopped after step
   4 and resumed (``launch.py --resume``) ends equal likewise; (d) seconds per phase beside the time plan's for the
   GPU's kind (H100, H200), printed, not judged, with the phases the plan misses and why. Bitwise equality under
   ``torch.use_deterministic_algorithms(True)`` and ``CUBLAS_WORKSPACE_CONFIG=:4096:8``; within
   ``gpu_system.TOLERANCE`` only where an op without a deterministic kernel warned (named in the JSON). It needs Ray,
   tqdm, tensorboard and psutil besides ``REQUIRED``: where one does not import the part is recorded as not run
   with one line naming them and ``gpu_check/pack_deps.sh``, which prepares them (``ok`` is then false; the other
   parts still run). A layout too big for the GPU is refused by the memory plan before any actor starts, naming
   the GPU and the bytes short. Where the sandbox lacks a defence ``verifier.require`` names, the verifiers run
   with ``verifier.allow_weak_sandbox=true`` and the part says so (``result.sandbox``).
   ``--standin`` runs this part on CPUs (``POPULORA_GPU_STANDIN=1``: a logical GPU, the actors on their CPU path;
   expected device ``cpu``; phases planned for the CPU layout): ``python -m gpu_check --parts system
   --standin`` (2 to 5 minutes on two cores, by their load; most of it starts the five systems).
6. ``vllm``: ``python -m gpu_check.vllm_check``, CUDA vLLM on the tiny test model with two adapters: generation, a
   hot swap (the next generation uses the new weights, the other adapter's output unchanged), the engine's
   sampled-token log-probs against the learner's (mean exp(engine - learner) within 1 +- 0.02 per adapter, at the
   7B presets' temperature and top_p) and, in the colocated layout, a sleep/wake that leaves the outputs equal.
   Where vLLM does not import, or is the CPU build, the part is ``not_run`` with the reason and does not count
   against ``ok`` (the machines lent so far have no vLLM); CI runs its hot swap and log-prob checks on vLLM's CPU
   build (``tests/test_engines.py``).

A bench part runs only where the module's ``--help`` lists the options it is given (``--device``,
``--widths``); otherwise it is recorded as not run, with the reason.

Each part is judged against its goal, not only its exit code (``goal`` and ``passed`` in its entry):
``gpu_tests`` every GPU test that imports without Ray passes (at least one ran); ``memory_plan`` the plan within
15% of every measured peak and never under one, and only configurations the plan says do not fit run out of memory
(the bench's ``within_goal``); ``learner`` 8 mixed adapters cost at most 1.15x one adapter with the same tokens;
``evolution`` every operator makes a 7B rank-64 child within its time goal; ``system`` every check of
``gpu_check/system.py`` (``result.checks``); ``vllm`` every check ``gpu_check/vllm_check.py`` ran. ``ok`` is the
conjunction (a ``vllm`` part that could not run here left out).

Besides torch, transformers and peft the project's modules need pydantic, trueskill, pyyaml, safetensors and
pytest (``REQUIRED``); a missing one stops the check at once with one line naming them and how to install them.
Without a CUDA device every part but the listing is recorded as skipped (``"status": "skipped"``) and ``ok`` is
false (the ``system`` part runs with ``--standin``). ``--parts`` picks parts (``--parts system``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BLOCK_RAY = "import sys; sys.modules['ray'] = None; import pytest; sys.exit(pytest.main(sys.argv[1:]))"
REQUIRED = {"torch": "torch", "transformers": "transformers", "peft": "peft", "pydantic": "pydantic",
            "trueskill": "trueskill", "yaml": "pyyaml", "safetensors": "safetensors", "pytest": "pytest"}
"""Import name -> PyPI name of what the parts import (no Ray, no vLLM)."""
LEARNER_RATIO_GOAL = 1.15
SYSTEM_REQUIRED = {"ray": "ray", "tqdm": "tqdm", "tensorboard": "tensorboard", "psutil": "psutil"}
"""Import name -> PyPI name of what the ``system`` part needs besides ``REQUIRED`` (``gpu_check/system.py``'s)."""
PACK_SCRIPT = "gpu_check/pack_deps.sh"
PART_NAMES = ("gpu_tests", "memory_plan", "learner", "evolution", "system", "vllm")


def missing_line(missing: list[str]) -> str:
    """The one line that names what the system part lacks here and the script that provides it."""
    return (f"the system part needs {', '.join(missing)}, which {'does' if len(missing) == 1 else 'do'} not import "
            f"here; {PACK_SCRIPT} packs them on a machine online (gpu_deps/), `bash gpu_deps/install.sh DIR` installs "
            "them here (see its header); then run the check again")


def missing_for_system() -> list[str]:
    """PyPI names of ``SYSTEM_REQUIRED`` that do not import in this process (imported, not just found: a blocked or
    broken Ray counts as missing)."""
    import importlib

    out = []
    for module, pypi in SYSTEM_REQUIRED.items():
        try:
            importlib.import_module(module)
        except ImportError:
            out.append(pypi)
    return out


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
    if name == "system":
        checks = result.get("checks") or {}
        return {"goal": "through Ray on the GPU: every actor's tensors on the device, one base mapped, adapters handed "
                        "over each step; a killed student learner and a resume from step 4 end equal to the reference",
                "passed": part["status"] == "ok" and result.get("passed") is True and bool(checks) and all(checks.values())}
    if name == "vllm":
        return {"goal": "CUDA vLLM: generation, a hot swap, log-prob ratio to the learner within 1 +- 0.02, sleep/wake "
                        "equal", "passed": part["status"] == "ok" and result.get("passed") is True}
    return {"goal": "exit status 0", "passed": part["status"] == "ok"}


def failure_reason(part: dict) -> str:
    """One line saying why a part did not pass: its timeout, its exit code or reason, or the goal it missed."""
    if part["status"] == "timeout":
        return f"timed out after {part['timeout_s']:g} s (--timeout)"
    if part["status"] == "failed":
        return part.get("reason") or f"exit code {part.get('returncode')}"
    if part.get("failed"):
        return "failing tests: " + ", ".join(part["failed"][:5])
    result = part.get("result") or {}
    shown = {k: result[k] for k in ("max_rel_error", "under_measured", "unexpected_failures",
                                     "mixed8_vs_single_ratio", "within_goal", "checks") if k in result}
    return f"goal missed: {json.dumps(shown)}" if shown else "goal missed"


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
    """Run ``cmd`` in the repository root; return code, seconds, the tails of its output, or the timeout.
    The part runs in its own process group with its output in files (not pipes a leftover grandchild could hold
    open): on a timeout the whole group (a Ray cluster the part started, its workers, sandboxed children) gets
    SIGTERM, then SIGKILL 15 s later, and both tails are kept, so the JSON says where the part was."""
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=err, text=True, start_new_session=True)
        try:
            proc.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(proc.pid, sig)
                    proc.wait(timeout=15)
                    break
                except ProcessLookupError:
                    break
                except subprocess.TimeoutExpired:
                    continue
        seconds = round(time.perf_counter() - start, 1)
        stdout, stderr = (f.seek(0) or f.read() for f in (out, err))
    if timed_out:
        return {"status": "timeout", "seconds": seconds, "timeout_s": timeout, "stdout_tail": stdout[-2000:],
                "stderr_tail": stderr[-3000:]}
    return {
        "status": "ok" if proc.returncode == 0 else "failed",
        "returncode": proc.returncode,
        "seconds": seconds,
        "stdout": stdout,
        "stderr_tail": stderr[-3000:],
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


def part_script(cmd: list[str], timeout: float) -> dict:
    """``gpu_check/system.py`` or ``gpu_check/vllm_check.py``: its JSON under ``result``; where it did not run (a
    dependency or the device missing) or the memory plan refused the layout, its reason is the part's."""
    result = part_bench(cmd, timeout)
    inner = result.get("result") or {}
    if inner.get("status") == "not_run":
        result["status"] = "not_run"
    if inner.get("reason"):
        result["reason"] = inner["reason"]
    if inner.get("phases"):  # (d): printed, not judged
        from gpu_check.system import print_phases

        print_phases(inner["phases"])
    return result


def offers(module: str, *options: str) -> tuple[bool, str]:
    """Whether ``python -m <module> --help`` lists every one of ``options``; and if not, why."""
    try:
        proc = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True,
                              timeout=300)
    except subprocess.TimeoutExpired:
        return False, f"python -m {module} --help timed out"
    if proc.returncode != 0:
        return False, f"python -m {module} --help failed ({proc.returncode}): {proc.stderr.strip()[-300:]}"
    missing = [o for o in options if not re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", proc.stdout)]
    if missing:
        return False, f"python -m {module} has no {'/'.join(missing)} option yet (its --help does not list it)"
    return True, ""


def parts(args: argparse.Namespace) -> dict[str, dict]:
    """Each part's command, or why it cannot run here."""
    py = sys.executable
    out: dict[str, dict] = {
        "gpu_tests": {"command": f"pytest -m gpu (ray blocked) {' '.join(gpu_test_files())}"},
        "memory_plan": {"command": [py, "-m", "bench.memory_plan", "--device", "cuda", "--layers", str(args.layers)]},
    }
    benches = {
        "learner": ("bench.learner", ["--device", "cuda", "--widths", "7b", "--layers", str(args.layers)]),
        "evolution": ("bench.operators", ["--device", "cuda"]),
    }
    for name, (module, options) in benches.items():
        if name not in args.parts:
            continue
        ok, reason = offers(module, *(o for o in options if o.startswith("--")))
        out[name] = {"command": [py, "-m", module, *options]} if ok else {"skip": reason}
    if "system" in args.parts:
        missing = missing_for_system()
        system = [py, "-m", "gpu_check.system", "--variant", args.variant]
        system += ["--standin"] if args.standin else []
        system += ["--model-dir", str(args.model_dir)] if args.model_dir else []
        system += ["--gpu-memory-gib", str(args.gpu_memory_gib)] if args.gpu_memory_gib else []
        system += ["--work-dir", str(args.work_dir)] if args.work_dir else []
        out["system"] = {"command": system} if not missing else {"skip": missing_line(missing)}
    out["vllm"] = {"command": [py, "-m", "gpu_check.vllm_check"]}
    return {name: part for name, part in out.items() if name in args.parts}


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
    parser.add_argument("--parts", default=",".join(PART_NAMES), help=f"comma-separated parts (default: all: "
                                                                        f"{','.join(PART_NAMES)})")
    parser.add_argument("--standin", action="store_true",
                        help="system part: run it on CPUs in the stand-in mode (POPULORA_GPU_STANDIN=1), no CUDA needed")
    parser.add_argument("--variant", choices=("test", "default"), default="test",
                        help="system part: the tiny model variant (default test; default: the tiny default's own)")
    parser.add_argument("--model-dir", type=Path, help="system part: a model directory built elsewhere (no build here)")
    parser.add_argument("--work-dir", type=Path, help="system part: keep its run directories and the actors' logs "
                                                      "here (default: a temporary directory, kept only if it fails)")
    parser.add_argument("--gpu-memory-gib", type=float,
                        help="system part: plan the layout for this many GiB per GPU instead of the device's (a test "
                             "hook for the too-small-GPU refusal)")
    args = parser.parse_args(argv)
    args.parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(args.parts) - set(PART_NAMES))
    if unknown:
        parser.error(f"--parts: unknown {', '.join(unknown)}; choose among {','.join(PART_NAMES)}")
    missing = missing_requirements()
    if missing:
        print(f"gpu_check: this machine lacks {', '.join(missing)}; install them first "
              f"(pip install {' '.join(missing)}; without a network: bash gpu_check/pack_deps.sh on a machine online, "
              f"carry gpu_deps, then bash gpu_deps/install.sh DIR and PYTHONPATH=DIR) and run the check again", file=sys.stderr)
        print(json.dumps({"ok": False, "missing": missing}))
        return 2
    plan = parts(args)
    if "skip" in plan.get("system", {}) and not args.dry:
        print(f"gpu_check: system part not run: {plan['system']['skip']}", file=sys.stderr)
    cuda = cuda_info()
    report: dict = {"cuda": cuda, "parts": {}}
    for name, part in plan.items():
        command = part.get("command")
        shown = " ".join(command[1:]) if isinstance(command, list) else command
        if args.dry:
            report["parts"][name] = {"status": "listed", "command": shown, **({"skip": part["skip"]} if "skip" in part else {})}
        elif "skip" in part:
            report["parts"][name] = {"status": "not_run", "reason": part["skip"]}
        elif not cuda["available"] and not (name == "system" and args.standin):
            report["parts"][name] = {"status": "skipped", "reason": f"no CUDA device ({cuda.get('reason')})", "command": shown}
        else:
            print(f"[gpu_check] {name}: {shown}", file=sys.stderr, flush=True)
            try:
                report["parts"][name] = (part_gpu_tests(args.timeout, args.out.parent) if name == "gpu_tests"
                                         else part_script(command, args.timeout) if name in ("system", "vllm")
                                         else part_bench(command, args.timeout))
            except Exception as exc:  # a broken part is recorded, the others still run
                report["parts"][name] = {"status": "failed", "reason": f"{type(exc).__name__}: {exc}"}
            report["parts"][name].update(judge(name, report["parts"][name]))
            done = report["parts"][name]
            verdict = (f"NOT RUN: {done.get('reason')}" if done["status"] == "not_run"
                       else "PASS" if done["passed"] else f"FAIL: {failure_reason(done)}")
            print(f"[gpu_check] {name}: {verdict} ({done['goal']})", file=sys.stderr, flush=True)
            # written after every part, so a check cut short (a lease ending, a kill) keeps what finished
            args.out.write_text(json.dumps({**report, "ok": None, "unfinished": True}, indent=1))
    counted = {n: p for n, p in report["parts"].items() if not (n == "vllm" and p["status"] == "not_run")}
    report["ok"] = bool(counted) and all(p.get("passed", p["status"] == "listed") for p in counted.values())
    if not args.dry:
        args.out.write_text(json.dumps(report, indent=1))
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
