"""Every ``python ...`` command README.md and docs/*.md show a user runs, at its smallest size.

``ROWS`` holds one row per key (``doc_commands.command_key``: the entry point and its options): how that command is
run here. A command a page adds without a row fails ``test_every_command_a_page_shows_has_a_row``.

- ``Run(argv)``: run here as ``python <argv>`` from the checkout, with small arguments (the key's options, values
  shrunk, and options that make it small); it must exit 0 without a traceback, and a bench, study or check must print
  its JSON object on its last line. ``{run}`` is a copy of the suite's shared short run (conftest ``short_run``: two
  steps of ``launch.py`` on the tiny test model), ``{run2}`` another copy, ``{data}`` benchmark files the test writes in
  each benchmark's own layout (``evaluation_files``), ``{qwen7b}`` a directory with Qwen2.5-7B's ``config.json``,
  ``{model}`` the shipped tiny test model, ``{cache}`` a tiny-model cache of the module, ``{tmp}`` a fresh directory.
  Rows with the same argv run once (one run with the options of several keys).
  ``long``: its smallest size takes minutes (the reason says what); skipped with that reason unless
  ``POPULORA_DOC_COMMANDS=all``.
- ``By(test)``: a test of the suite runs that command with these options (the row names it; its file must exist and
  name the entry point and each option).
- ``Skip(reason)``: it cannot run on a CPU machine (a GPU, a cluster, a build's saved progress); a visible skip.
- ``Usage()``: a synopsis; each option it names is one its program defines.
- ``Suite()``: a pytest command; each test file it names exists (the suite runs them itself).
- ``Family(package)``: ``python -m bench.<name>``; every module of the package that runs as a command has rows.

``test_a_missing_path_is_named_without_a_traceback``: a documented command given a model, run directory or data file
that does not exist names it in one line and exits non-zero, without a traceback.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from doc_commands import ROOT, doc_commands, options_of
from short_runs import SHORT, launch_env

ALL = os.environ.get("POPULORA_DOC_COMMANDS") == "all"


@dataclass(frozen=True)
class Run:
    argv: tuple[str, ...]
    json_last: bool = False
    long: str = ""
    """Why its smallest size takes minutes (then skipped unless POPULORA_DOC_COMMANDS=all)."""
    in_copy: bool = False
    """Run in a copy of the checkout (it writes into the checkout's tracked files)."""


@dataclass(frozen=True)
class By:
    test: str


@dataclass(frozen=True)
class Skip:
    reason: str


@dataclass(frozen=True)
class Usage:
    pass


@dataclass(frozen=True)
class Suite:
    pass


@dataclass(frozen=True)
class Family:
    package: str


def run_(*argv: str, **kw) -> Run:
    return Run(tuple(argv), **kw)


def bench(*argv: str, **kw) -> Run:
    return Run(tuple(argv), json_last=True, **kw)


LAUNCH = [o for o in SHORT if o != "run.checkpoint_every=1"]
"""Overrides of a launch that takes seconds a step (``short_runs.SHORT``)."""
TINY_BENCH = bench("-m", "bench.tiny_coder", "--variant", "test", "--model-dir", "{model}", "--proposals", "2",
                   "--baseline-proposals", "1", "--sample-seeds", "1234,1", "--probes", "2", "--probe-samples", "1",
                   "--seen-probes", "2")
"""The tiny model's bench with every option its pages' commands give it, once (~40 CPU-s)."""
DYNAMICS = "tests/test_dynamics_bench.py::test_smoke_study_reports_every_claim"
"""The dynamics study's smoke run and its kept folder's reruns (one seed, three steps, three probes)."""
CALIBRATE = "--repeats 1 --rows 3 --new 4 --prompt 16 --train-seqs 4 --train-prompt 20 --train-completion 8 --verifier-tasks 20"
EVAL = ("--limit", "1", "--max-tokens", "8", "--workers", "2")
BUILD = "a build of the test variant, the smallest tiny model (~4 min on two busy cores)"
VLLM = ("starts vLLM's CPU engine (~40 s), which the suite starts only in the machine-a group: that group counts vLLM's "
        "/dev/shm queues, which this module's group would add to")
GPU_7B = "needs GPUs: the 7B preset on an 8-GPU node"
WIDTHS_7B = "a model of Qwen2.5-7B's widths (a 2.2 GB embedding) built and stepped on the CPU (over 3 CPU-minutes)"

ROWS: dict[str, Run | By | Skip | Usage | Suite | Family] = {
    # launch.py ------------------------------------------------------------------------------------------------------
    "python launch.py": By("tests/conftest.py::short_run"),
    "python launch.py --run-dir": By("tests/conftest.py::short_run"),
    "python launch.py --resume --steps": By("tests/conftest.py::short_run_resumed"),
    "python launch.py --resume": run_("launch.py", "--resume", "{run}"),
    "python launch.py --steps": By("tests/test_vllm_system.py::test_vllm_runs_the_loop_like_transformers_and_resumes"),
    "python launch.py --dry-run": run_("launch.py", "--dry-run", "population.teachers=4", "lora.rank=16"),
    "python launch.py --config --dry-run": run_("launch.py", "--dry-run", "--config", "configs/qwen2.5-7b-4t4s.yaml",
                                                "model.path={qwen7b}"),
    "python launch.py --config": Skip(f"{GPU_7B} under `ray job submit`"),
    "python launch.py --config --run-dir": Skip(f"{GPU_7B} and more: a cluster of several GPU nodes (`ray up cluster.yaml`)"),
    "usage: python launch.py --all --cluster --config --constants --dry-run --from-run --quiet --resume --run-dir --steps": Usage(),
    # evaluation, export, reporting ----------------------------------------------------------------------------------
    "python -m evaluation": run_("-m", "evaluation", "{run}", "--benchmarks", "gsm8k", "--data", "{data}", "--no-base", *EVAL),
    "python -m evaluation --benchmarks --data": run_("-m", "evaluation", "{run}", "--benchmarks",
                                                     "humaneval+,mbpp+,livecodebench,math500,gsm8k", "--data", "{data}", *EVAL),
    "python -m evaluation --benchmarks --compare --data": run_("-m", "evaluation", "{run}", "--benchmarks", "humaneval+,aime24",
                                                               "--data", "{data}", "--compare", "{run2}", *EVAL),
    "python -m evaluation --benchmarks --samples --temperature": run_(
        "-m", "evaluation", "{run}", "--benchmarks", "mbpp+={data}/MbppPlus.jsonl", "--samples", "2", "--temperature", "0.8",
        "--no-base", *EVAL),
    "python -m evaluation --benchmarks --data --oracle": run_("-m", "evaluation", "{run}", "--benchmarks", "humaneval+,mbpp+,gsm8k",
                                                              "--data", "{data}", "--oracle", "--workers", "2"),
    "usage: python -m evaluation --benchmarks --checkpoint --compare --data --oracle --samples": Usage(),
    "python -m evaluation.export": run_("-m", "evaluation.export", "{run}"),
    "python -m evaluation.export --checkpoint --member --merge": run_("-m", "evaluation.export", "{run}", "--member", "best",
                                                                      "--checkpoint", "2", "--merge"),
    "usage: python -m evaluation.export --checkpoint --member --merge --out": Usage(),
    "python -m reporting": run_("-m", "reporting", "{run}", "{run2}"),
    "usage: python -m reporting": Usage(),
    # the verifier ---------------------------------------------------------------------------------------------------
    "python -m verifier defences": run_("-m", "verifier", "defences", "--require"),
    "python -m verifier run --args": run_("-m", "verifier", "run", "{tmp}/prog.py", "--args", "'abc', [1, 2]"),
    "python -m verifier prompts --family --style": run_("-m", "verifier", "prompts", "--style", "r1", "--family", "code_i"),
    "python -m verifier prompts --model --style": run_("-m", "verifier", "prompts", "--style", "chat", "--model", "{model}"),
    "python -m verifier prompts --model": run_("-m", "verifier", "prompts", "--model", "{model}"),
    "python -m verifier prompts --config --model --role": run_("-m", "verifier", "prompts", "--config",
                                                               "configs/qwen2.5-7b-4t4s.yaml", "--model", "{model}", "--role", "teacher"),
    "python -c <bootstrap>": Skip("the sandbox's own server process (verifier/forkserver.py starts it), not a command a "
                                  "user runs; every verifier test runs it"),
    # tinycoder ------------------------------------------------------------------------------------------------------
    "python -m tinycoder --variant": run_("-m", "tinycoder", "--variant", "test"),
    "python -m tinycoder --here": run_("-m", "tinycoder", "--here", "--variant", "test", "--cache-dir", "{cache}",
                                       "--threads", "1", long=BUILD),
    "python -m tinycoder build --variant": run_("-m", "tinycoder", "build", "--variant", "test", "--cache-dir", "{cache}",
                                                "--threads", "1", long=BUILD),
    "python -m tinycoder build --threads --variant": run_("-m", "tinycoder", "build", "--variant", "test", "--cache-dir",
                                                          "{cache}", "--threads", "1", long=BUILD),
    "python -m tinycoder build --ship --variant": run_("-m", "tinycoder", "build", "--variant", "test", "--cache-dir", "{cache}",
                                                       "--threads", "1", "--ship", long=BUILD, in_copy=True),
    "python -m tinycoder snapshot": Skip("needs a build's saved progress (an unfinished build of hours, or a copy of "
                                         "one); tests/test_tinycoder_snapshot.py makes a snapshot of a short build's"),
    "python -m tinycoder snapshot --out --save --variant": Skip("needs a build's saved progress (an unfinished build of "
                                                                "hours, or a copy of one); tests/test_tinycoder_snapshot.py"
                                                                " makes a snapshot of a short build's"),
    "python -m bench.tiny_coder": TINY_BENCH,
    "python -m bench.tiny_coder --proposals --variant": TINY_BENCH,
    "python -m bench.tiny_coder --baseline-proposals --probes --proposals --sample-seeds --variant": TINY_BENCH,
    "python -m bench.tiny_coder --probes --proposals --sample-seeds --seen-probes --variant": TINY_BENCH,
    "python -m bench.tiny_coder --model-dir --probes --proposals --sample-seeds --seen-probes": TINY_BENCH,
    "python -m bench.tiny_coder --step-timing": bench("-m", "bench.tiny_coder", "--step-timing", "--variant", "test",
                                                      "--step-timing-rounds", "1"),
    "python -m bench.tiny_coder --step-timing --step-timing-rounds": bench("-m", "bench.tiny_coder", "--step-timing",
                                                                           "--variant", "test", "--step-timing-rounds", "1"),
    "python -m bench.tiny_coder --fresh": bench("-m", "bench.tiny_coder", "--fresh", "--variant", "test", "--proposals", "2",
                                                "--baseline-proposals", "1", long=BUILD),
    "python -m bench.tiny_coder --check-shipped --variant": bench("-m", "bench.tiny_coder", "--check-shipped", "--variant",
                                                                  "test", "--proposals", "2", long=BUILD),
    # the other benches ----------------------------------------------------------------------------------------------
    "python -m bench.<name>": Family("bench"),
    "python -m bench.sandbox": bench("-m", "bench.sandbox", "--tasks", "20", "--baseline-tasks", "4", "--workers", "2"),
    "python -m bench.operators": bench("-m", "bench.operators", "--no-dense", "--layers", "1", "--repeats", "1",
                                       "--threads", "1", "--operators", "gaussian_noise,blend_svd"),
    "python -m bench.operators --no-dense": bench("-m", "bench.operators", "--no-dense", "--layers", "1", "--repeats", "1",
                                                  "--threads", "1", "--operators", "gaussian_noise,blend_svd"),
    "python -m bench.learner": bench("-m", "bench.learner", "--quick"),
    "python -m bench.learner --layers --repeats --threads --widths": bench("-m", "bench.learner", "--widths", "7b", "--layers",
                                                                           "1", "--repeats", "1", "--threads", "1",
                                                                           long=WIDTHS_7B),
    "python -m bench.learner_memory": bench("-m", "bench.learner_memory", "--sizes", "0.1B", "--settle", "0"),
    "python -m bench.learner_memory --step-peaks": bench("-m", "bench.learner_memory", "--step-peaks", "--layers", "1",
                                                         "--loss-tokens", "64", "--chunk", "32", "--threads", "1",
                                                         long=WIDTHS_7B),
    "python -m bench.memory_plan": bench("-m", "bench.memory_plan", "--layers", "1", "--slots", "1", "--tokens", "64",
                                         "--chunk", "32", "--threads", "1", long=WIDTHS_7B),
    "python -m bench.memory_plan --device --layers": Skip("needs a GPU: --device cuda measures CUDA memory (the GPU "
                                                          "machine's check runs it: python -m gpu_check)"),
    "python -m bench.colocated_memory": Skip("needs a GPU: it measures the CUDA caching allocator (and says so on a "
                                             "CPU machine)"),
    "python -m bench.adapter_transport": bench("-m", "bench.adapter_transport", "--layers", "1", "--replicas", "1",
                                               "--repeats", "1"),
    "python -m bench.generation": bench("-m", "bench.generation", "--quick", "--backends", "hf"),
    "python -m bench.generation --backends": bench("-m", "bench.generation", "--quick", "--backends", "hf"),
    "python -m bench.generation --prompt-tokens --vllm-args": bench(
        "-m", "bench.generation", "--quick", "--backends", "vllm", "--prompt-tokens", "16", "--vllm-args",
        '{"enable_prefix_caching": false}', long=VLLM),
    "python -m bench.eval_harness": bench("-m", "bench.eval_harness", "--problems", "2", "--max-tokens", "8", "--repeats",
                                          "1", "--backend", "hf", "--workers", "2", "--threads", "1"),
    "python -m bench.data_parallel": bench("-m", "bench.data_parallel", "--repeats", "1",
                                           long="a Ray cluster whose data parallel learners step a model (~4 min on two "
                                                "busy cores)"),
    "python -m bench.replica_balance": bench("-m", "bench.replica_balance", "--rounds", "1", "--short", "2", "--long", "1",
                                             "--short-tokens", "4", "--long-tokens", "8", "--uniform-tokens", "4"),
    "python -m bench.system_backends": bench("-m", "bench.system_backends", "--steps", "1", "--backends", "hf",
                                             *[f"--override={o}" for o in LAUNCH]),
    "python -m bench.time_plan": bench("-m", "bench.time_plan", "--steps", "2", "--calibrate-options", CALIBRATE,
                                       long="a launch.py run and a calibration (~1-2 min)"),
    "python -m bench.overlap": bench("-m", "bench.overlap", "--steps", "4", "--calibrate-options", CALIBRATE, *LAUNCH,
                                     long="two launch.py runs and a calibration (~1.5-3 min)"),
    "python -m bench.overlap --steps": bench("-m", "bench.overlap", "--steps", "4", "--calibrate-options", CALIBRATE, *LAUNCH,
                                             long="two launch.py runs and a calibration (~1.5-3 min)"),
    # the studies ----------------------------------------------------------------------------------------------------
    "python -m studies.<name>": Family("studies"),
    "python -m studies.retention": bench("-m", "studies.retention", "--variant", "test", "--parent-steps", "1",
                                         "--recovery-steps", "1", "--tasks", "2", "--rollouts", "2", "--probes", "2",
                                         "--samples", "1", "--operators", "gaussian_noise,blend_svd", "--threads", "1"),
    "python -m studies.student_rl": bench("-m", "studies.student_rl", "--steps", "1", "--tasks", "2", "--rollouts", "2",
                                          "--probes", "2", "--samples", "1"),
    "python -m studies.learning": bench("-m", "studies.learning", "--steps", "1", "--probes", "2", "--samples", "1",
                                        "--variant", "test", *LAUNCH[1:], long="two launch.py runs and the probes (~2.5 min)"),
    "usage: python -m studies.learning --keep --probes --steps": Usage(),
    "python -m studies.dynamics": By(DYNAMICS),
    "python -m studies.dynamics --jobs --keep --seeds --steps": By(DYNAMICS),
    "python -m studies.dynamics --jobs --keep --probes --seeds --steps": By(DYNAMICS),
    "python -m studies.dynamics --probes --samples --seeds --steps": By(DYNAMICS),
    "python -m studies.dynamics --jobs --keep --population-config --seeds --single-config --steps": By(DYNAMICS),
    "python -m studies.dynamics --jobs --keep --population-config --probes --seeds --single-config --steps": By(DYNAMICS),
    "python -m studies.dynamics --keep --report-only": By("tests/test_dynamics_bench.py::test_a_failed_run_is_reported_and_left_out"),
    "python -m studies.dynamics --keep --report-only --seeds --steps": By(
        "tests/test_dynamics_bench.py::test_a_failed_run_is_reported_and_left_out"),
    "python -m studies.dynamics --against --keep --report-only --seeds --steps": By(
        "tests/test_dynamics_bench.py::test_runs_of_another_study_are_refused_before_any_run"),
    "python -m studies.dynamics --against --keep --population-config --report-only --seeds --single-config --steps": By(
        "tests/test_dynamics_bench.py::test_runs_of_another_study_are_refused_before_any_run"),
    "python -m studies.dynamics --first-seed --jobs --keep --seeds --steps": By(
        "tests/test_dynamics_bench.py::test_first_seed_selects_another_seed_set"),
    # the GPU machine's check, the calibration -----------------------------------------------------------------------
    "python -m gpu_check": By("tests/test_memory_plan.py::test_gpu_check_without_cuda_records_every_part_and_writes_one_json"),
    "python -m gpu_check --parts": bench("-m", "gpu_check", "--parts", "vllm", "--out", "{tmp}/gpu_check.json"),
    "python -m gpu_check --timeout": bench("-m", "gpu_check", "--parts", "vllm", "--timeout", "60", "--out",
                                           "{tmp}/gpu_check.json"),
    "python -m gpu_check.system": By("tests/test_gpu_system_check.py::test_the_whole_system_part_on_the_standin_gpu"),
    "python -m gpu_check.vllm_check": By("tests/test_gpu_system_check.py::test_the_vllm_part_says_why_it_did_not_run_and_leaves_ok_alone"),
    "python -m gpu_check.vllm_check --device": bench("-m", "gpu_check.vllm_check", "--device", "cpu", long=VLLM),
    "python -m planning.calibrate": By("tests/test_calibrate.py::test_calibrate_measures_the_tiny_model_and_the_dry_run_plans_with_it"),
    "python -m planning.calibrate --out": By("tests/test_calibrate.py::test_calibrate_measures_the_tiny_model_and_the_dry_run_plans_with_it"),
    "python -m planning.calibrate --config --engine --repeats": Skip(
        "needs a GPU: calibrates the 7B preset on a random model of Qwen2.5-7B's widths (6.5 B parameters); "
        "tests/test_calibrate.py calibrates the tiny model on CPU"),
    "python -m planning.measurements": bench("-m", "planning.measurements", "--rows", "2", "--new", "4", "--prompt", "16",
                                             "--train-seqs", "2", "--train-prompt", "16", "--train-completion", "8",
                                             "--repeats", "1"),
    # set-up and the tests -------------------------------------------------------------------------------------------
    "python -m venv": run_("-m", "venv", "--without-pip", "{tmp}/venv"),
    "python -c from inference import vllm_available; print(vllm_available())": run_(
        "-c", "from inference import vllm_available; print(vllm_available())"),
    "python -m pytest --dist -n -q": Suite(),
    "python -m pytest -m -q": Suite(),
    "python -m pytest -q": Suite(),
}

COMMANDS = doc_commands()
KEYS = sorted({c.key for c in COMMANDS})
RUNS = {key: row for key, row in ROWS.items() if isinstance(row, Run)}


def shown(key: str) -> str:
    """Where the pages show ``key``'s commands (for messages)."""
    return "; ".join(sorted({f"{c.page}: {c.text}" for c in COMMANDS if c.key == key}))[:400]


def test_the_pages_show_commands_and_every_one_has_a_row():
    assert len(COMMANDS) > 150 and {"python launch.py", "python -m evaluation.export"} <= set(KEYS)
    missing = [f"{key}  ({shown(key)})" for key in KEYS if key not in ROWS]
    assert not missing, "commands with no row in tests/test_doc_commands.py ROWS:\n" + "\n".join(missing)
    assert not set(ROWS) - set(KEYS), f"rows of commands no page shows any more: {sorted(set(ROWS) - set(KEYS))}"


def entry_of(key: str) -> str:
    """The program of a key: ``launch.py`` or the module (``verifier`` of ``python -m verifier run``)."""
    words = key.removeprefix("usage: ").split()
    return words[1] if words[1] != "-m" else words[2]


def program_of(key: str) -> str:
    """The words of a key before its options: ``-m verifier run``, ``launch.py``, ``-c <code>``."""
    words = key.removeprefix("usage: ").split()[1:]
    return " ".join(words[:len(words) - len(options_of(key))])


@pytest.mark.parametrize("key", sorted(RUNS))
def test_a_run_row_runs_its_keys_program_with_each_of_its_options(key):
    argv = RUNS[key].argv
    assert f"{' '.join(argv)} ".startswith(f"{program_of(key)} "), (key, argv)
    given = {a.split("=")[0] for a in argv if a.startswith("-")}
    assert set(options_of(key)) <= given, (key, set(options_of(key)) - given)


@pytest.mark.parametrize("key", sorted(k for k, r in ROWS.items() if isinstance(r, By)))
def test_a_row_run_elsewhere_names_a_test_that_runs_it(key):
    path, _, name = ROWS[key].test.partition("::")
    source = (ROOT / path).read_text()
    assert re.search(rf"^def {name}\(", source, re.M), f"{key}: {ROWS[key].test} is gone"
    runs = [entry_of(key)] + (["launch("] if entry_of(key) == "launch.py" else [])  # short_runs.launch runs launch.py
    assert any(r in source for r in runs), f"{key}: {path} does not run {entry_of(key)}"
    absent = [o for o in options_of(key) if f'"{o}"' not in source]
    assert not absent, f"{key}: {path} passes no {absent}"


@pytest.mark.parametrize("key", sorted(k for k, r in ROWS.items() if isinstance(r, Usage)))
def test_a_synopsis_names_only_options_its_program_has(key):
    entry = entry_of(key)
    source = ROOT / (entry if entry.endswith(".py") else entry.replace(".", "/") + ("/__main__.py" if (
        ROOT / entry.replace(".", "/")).is_dir() else ".py"))
    text = source.read_text()
    assert not [o for o in options_of(key) if f'"{o}"' not in text], key


@pytest.mark.parametrize("key", sorted(k for k, r in ROWS.items() if isinstance(r, Suite)))
def test_a_pytest_command_names_test_files_that_exist(key):
    named = {w.split("::")[0] for c in COMMANDS if c.key == key for w in c.words if w.startswith("tests/")}
    assert not [n for n in named if not (ROOT / n).is_file()], named


@pytest.mark.parametrize("key", sorted(k for k, r in ROWS.items() if isinstance(r, Family)))
def test_every_module_of_a_family_has_its_rows(key):
    package = ROOT / ROWS[key].package
    commands = [p.stem for p in package.glob("*.py") if "__main__" in p.read_text()]
    missing = [m for m in commands if not any(k.startswith(f"python -m {package.name}.{m}") for k in ROWS)]
    assert commands and not missing, missing


@pytest.mark.parametrize("key", sorted(k for k, r in ROWS.items() if isinstance(r, Skip)))
def test_a_command_that_cannot_run_here_is_skipped_with_why(key):
    pytest.skip(f"{key}: {ROWS[key].reason}")


# running them ------------------------------------------------------------------------------------------------------
@dataclass
class Ran:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    cpu_seconds: float
    """CPU time of the command and the processes it waited for (Ray's, a study's runs)."""


def cpu_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class Places:
    """What the rows' placeholders stand for, each made once per module when a row first needs it."""

    def __init__(self, short_run, tmp_path_factory):
        self.short_run, self.factory = short_run, tmp_path_factory
        self.made: dict[str, str] = {}
        self.ran: dict[tuple[str, ...], Ran] = {}

    def copy_of_run(self) -> str:
        assert self.short_run.returncode == 0, self.short_run.stderr[-3000:]
        target = self.factory.mktemp("run") / "run"
        shutil.copytree(self.short_run.run_dir, target)
        return str(target)

    def value(self, name: str) -> str:
        if name in ("run", "run2", "tmp"):  # every row its own copies and directory
            return self.copy_of_run() if name != "tmp" else str(self.factory.mktemp("tmp"))
        if name not in self.made:
            self.made[name] = self.make(name)
        return self.made[name]

    def make(self, name: str) -> str:
        if name == "data":
            from evaluation_files import write_all

            data = self.factory.mktemp("benchmarks")
            write_all(data)
            return str(data)
        if name == "qwen7b":
            from bench.qwen25_7b import CONFIG

            path = self.factory.mktemp("qwen7b")
            (path / "config.json").write_text(json.dumps(CONFIG))
            return str(path)
        if name == "model":
            from tinycoder import ensure_model

            return str(ensure_model("test", progress=False))
        if name == "cache":
            return str(self.factory.mktemp("tiny-coder-cache"))
        raise KeyError(name)

    def argv(self, row: Run) -> tuple[str, ...]:
        names = set(re.findall(r"\{(\w+)\}", " ".join(row.argv)))
        values = {n: self.value(n) for n in sorted(names)}
        return tuple(re.sub(r"\{(\w+)\}", lambda m: values[m.group(1)], a) for a in row.argv)

    def run(self, row: Run) -> Ran:
        if row.argv in self.ran:  # the same command for another key: run once
            return self.ran[row.argv]
        argv = self.argv(row)
        for a in argv:  # a program for the verifier's row
            if a.endswith("/prog.py"):
                Path(a).write_text("def f(s, xs):\n    return s[::-1], sum(xs)\n")
        cwd = ROOT
        if row.in_copy:  # the tracked files, as a clone has them
            cwd = self.factory.mktemp("checkout")
            files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
            for name in files.decode().split("\0"):
                if name and (ROOT / name).is_file():
                    (cwd / name).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(ROOT / name, cwd / name)
        started, before = time.monotonic(), cpu_of_children()
        done = subprocess.run([sys.executable, *argv], cwd=cwd, env=launch_env(), capture_output=True, text=True,
                              timeout=1500)
        ran = Ran(argv, done.returncode, done.stdout, done.stderr, time.monotonic() - started, cpu_of_children() - before)
        self.ran[row.argv] = ran
        return ran


@pytest.fixture(scope="module")
def places(short_run, tmp_path_factory) -> Places:
    return Places(short_run, tmp_path_factory)


@pytest.mark.parametrize("key", sorted(RUNS))
def test_the_command_runs(key, places):
    row = RUNS[key]
    if row.long and not ALL:
        pytest.skip(f"{key}: {row.long}; POPULORA_DOC_COMMANDS=all runs it")
    ran = places.run(row)
    print(f"{key}: {ran.seconds:.1f} s, {ran.cpu_seconds:.1f} CPU-s: python {' '.join(ran.argv)}")
    assert ran.returncode == 0, f"python {' '.join(ran.argv)}\n{ran.stdout[-2000:]}\n{ran.stderr[-4000:]}"
    assert "Traceback (most recent call last)" not in ran.stderr, ran.stderr[-4000:]
    if row.json_last:
        json.loads(ran.stdout.strip().splitlines()[-1])


# bad input ---------------------------------------------------------------------------------------------------------
MISSING_PATHS = [
    ("launch.py", "--resume", "{missing}"),
    ("launch.py", "--dry-run", "--config", "{missing}.yaml"),
    ("launch.py", "--dry-run", "--config", "configs/qwen2.5-7b-4t4s.yaml", "model.path={missing}"),
    ("launch.py", "--dry-run", "--from-run", "{missing}"),
    ("launch.py", "--dry-run", "--constants", "{missing}.yaml"),
    ("-m", "evaluation", "{missing}", "--benchmarks", "gsm8k", "--data", "{data}"),
    ("-m", "evaluation", "{run}", "--benchmarks", "gsm8k", "--data", "{missing}"),
    ("-m", "evaluation", "{run}", "--benchmarks", "mbpp+={missing}.jsonl.gz"),
    ("-m", "evaluation.export", "{missing}"),
    ("-m", "reporting", "{missing}"),
    ("-m", "reporting", "{run}", "{missing}"),
    ("-m", "verifier", "run", "{missing}.py", "--args", "1"),
    ("-m", "verifier", "prompts", "--model", "{missing}"),
    ("-m", "planning.calibrate", "--out", "{tmp}/node.yaml", "--config", "{missing}.yaml"),
    ("-m", "bench.tiny_coder", "--model-dir", "{missing}"),
    ("-m", "bench.eval_harness", "--model", "{missing}"),
    ("-m", "bench.generation", "--model", "{missing}", "--backends", "hf"),
    ("-m", "bench.overlap", "--from-runs", "{missing}"),
    ("-m", "studies.dynamics", "--report-only", "--keep", "{missing}"),
    ("-m", "studies.learning", "--score-only", "--keep", "{missing}"),
    ("-m", "studies.retention", "--model-dir", "{missing}"),
    ("-m", "studies.student_rl", "--model", "{missing}"),
    ("-m", "gpu_check.vllm_check", "--model-dir", "{missing}", "--device", "cpu"),
]
"""Documented commands given a model, run directory, data or settings file that does not exist."""


@pytest.mark.parametrize("argv", MISSING_PATHS, ids=lambda a: " ".join(a).replace("{missing}", "MISSING")[:70]
                         if isinstance(a, tuple) else None)
def test_a_missing_path_is_named_without_a_traceback(argv, places, tmp_path):
    missing = str(tmp_path / "nowhere" / "x")
    row = Run(tuple(a.replace("{missing}", missing) for a in argv))
    ran = places.run(row)
    said = ran.stdout + ran.stderr
    assert ran.returncode != 0, said[-2000:]
    assert "Traceback (most recent call last)" not in said, said[-4000:]
    assert missing in said, said[-2000:]
